"""Rule-based hint generators keyed on the trajectory's machine-readable turn metadata.

Each generator takes a :class:`Trajectory` (and the episode's tool schemas where needed) and returns
:class:`Hint` objects aimed at the turn that went wrong: the teacher sees the hint right before that
turn, the student does not, and self-distillation pulls the student toward the hinted behaviour.
"""

from __future__ import annotations

import json
from typing import Any

from cadenza.agent.trajectory import Trajectory, TurnMeta
from cadenza.feedback.hints import Hint


def tool_names(tools: list[dict[str, Any]]) -> list[str]:
    """Names from OpenAI function-calling schemas (``{"type": "function", "function": {...}}`` or bare)."""
    return [_function(t)["name"] for t in tools]


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    return tool.get("function", tool)


def tool_not_found(traj: Trajectory, tools: list[dict[str, Any]]) -> list[Hint]:
    """A call to a tool that does not exist -> ``Reminder: the available tools are a, b, c.``"""
    text = "Reminder: the available tools are " + ", ".join(tool_names(tools)) + "."
    return [
        Hint(turn=t.index, text=text, kind="tool_not_found")
        for t in traj.turns
        if t.error_kind == "tool_not_found"
    ]


def invalid_arguments(traj: Trajectory, tools: list[dict[str, Any]]) -> list[Hint]:
    """A call with arguments the tool rejects -> that tool's parameter schema (compact JSON)."""
    by_name = {_function(t)["name"]: _function(t) for t in tools}
    hints = []
    for t in traj.turns:
        if t.error_kind != "invalid_arguments" or t.tool not in by_name:
            continue
        params = json.dumps(by_name[t.tool].get("parameters", {}), separators=(",", ":"), sort_keys=True)
        text = f"Reminder: the arguments of {t.tool} must match this JSON schema: {params}"
        hints.append(Hint(turn=t.index, text=text, kind="invalid_arguments"))
    return hints


def observation_of(traj: Trajectory, turn: TurnMeta) -> str:
    """The tool results answering ``turn`` (the tool messages after its assistant message), joined."""
    out = []
    for msg in traj.messages[turn.message_index + 1 :]:
        if msg.get("role") != "tool":
            break
        out.append(str(msg.get("content", "")))
    return "\n".join(out)


def _failed(turn: TurnMeta) -> bool:
    return turn.error_kind is not None or (turn.exit_code is not None and turn.exit_code != 0)


def _command_key(turn: TurnMeta) -> str | None:
    if turn.tool is None:
        return None
    return turn.tool + "\0" + json.dumps(turn.arguments, sort_keys=True, default=str)


def repeated_failure(traj: Trajectory, min_repeats: int = 2) -> list[Hint]:
    """The same failing command, with the same failing result, issued again -> a nudge to change approach.

    Rerunning a failing test after an edit is legitimate, so a repeat only counts when the
    observation is identical too. The hint targets the ``min_repeats``-th occurrence and later ones.
    """
    seen: dict[tuple[str, str], list[int]] = {}
    hints = []
    for t in traj.turns:
        key = _command_key(t)
        if key is None or not _failed(t):
            continue
        occurrences = seen.setdefault((key, observation_of(traj, t)), [])
        occurrences.append(t.index)
        if len(occurrences) >= min_repeats:
            first = occurrences[0]
            text = (
                f"Reminder: this exact {t.tool} call already failed the same way at turn {first}; "
                "repeating it will not help. Change your approach."
            )
            hints.append(Hint(turn=t.index, text=text, kind="repeated_failure"))
    return hints
