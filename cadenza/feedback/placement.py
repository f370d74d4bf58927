"""Where a hint goes in the teacher's context.

``user_before_turn`` (default): a new user message right before the target assistant turn, so the
hint is the last thing the model reads. ``append_to_observation``: the hint is appended to the
message that precedes the target turn (the previous tool result, or the task prompt for turn 0), as
if the environment had said it; no extra message, so chat templates that forbid consecutive user
messages still work. ``none``: nothing is inserted (a control: the same turns get SD, with no
words). Only the teacher sees the hint; the student keeps the original context.
"""

from __future__ import annotations

import copy
from typing import Any, get_args

from cadenza.errors import ConfigError
from cadenza.feedback.hints import Hint, Placement

PLACEMENTS: tuple[str, ...] = get_args(Placement)


def check_placement(placement: str) -> None:
    if placement not in PLACEMENTS:
        raise ConfigError(f"unknown hint placement {placement!r}; use one of {', '.join(PLACEMENTS)}")


def hinted_prefix(
    messages: list[dict[str, Any]], message_index: int, hints: list[Hint], placement: str = "user_before_turn"
) -> list[dict[str, Any]]:
    """The messages before ``messages[message_index]`` (the target assistant turn) with the hints inserted."""
    check_placement(placement)
    if not 0 < message_index <= len(messages):
        raise ConfigError(
            f"hint target message {message_index} is outside the trajectory ({len(messages)} messages)"
        )
    text = "\n".join(h.text for h in hints)
    prefix = copy.deepcopy(messages[:message_index])
    if placement == "user_before_turn":
        return [*prefix, {"role": "user", "content": text}]
    if placement == "none":
        return prefix
    last = prefix[-1]
    last["content"] = f"{last.get('content') or ''}\n\n{text}"
    return prefix
