"""Optional LLM critic: asks a model behind an OpenAI-compatible ``/chat/completions`` endpoint which
turns could have been better, and turns its answer into hints. Plain ``urllib``; no SDK.

The critic answers with JSON: ``[{"turn": <int>, "hint": "<short text>"}]``. Turns that do not exist
and malformed items are dropped; a network or server failure yields no hints (and a warning in the
returned ``errors`` list) so a flaky critic never stops a training run.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from cadenza.agent.trajectory import Trajectory
from cadenza.errors import ConfigError
from cadenza.feedback.hints import Hint

CRITIC_PROMPT = (
    "You review a coding agent's trajectory. Assistant turns are numbered from 0. For each turn that "
    "could clearly have been better, write one short, concrete hint the agent could have used right "
    'before that turn. Answer with a JSON list only: [{"turn": <int>, "hint": "<text>"}]. '
    "Answer [] if every turn was reasonable."
)


@dataclass(kw_only=True)
class CriticConfig:
    base_url: str = ""  # e.g. http://localhost:8000/v1 ; empty disables the critic
    model: str = ""  # model name sent to the endpoint
    api_key_env: str = "OPENAI_API_KEY"  # name of the environment variable holding the key (if any)
    timeout_s: float = 30.0  # per request; a timeout gives no hints (recorded, never fatal)
    max_hints: int = 3  # hints kept per trajectory
    max_chars: int = 300  # each hint is capped at this length

    def validate(self) -> None:
        if self.base_url and not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(
                f"[feedback.critic] base_url must start with http:// or https://, got {self.base_url!r}"
            )
        if self.base_url and not self.model:
            raise ConfigError("[feedback.critic] set model when base_url is set")


def render_for_critic(traj: Trajectory) -> str:
    """A compact transcript with turn numbers on assistant messages."""
    turn_of = {t.message_index: t.index for t in traj.turns}
    lines = []
    for i, msg in enumerate(traj.messages):
        role = msg.get("role", "?")
        content = msg.get("content") or ""
        if role == "assistant":
            calls = msg.get("tool_calls") or []
            call_txt = " ".join(json.dumps(c.get("function", c), default=str) for c in calls)
            head = f"[turn {turn_of[i]}] assistant" if i in turn_of else "assistant"
            lines.append(f"{head}: {content} {call_txt}".rstrip())
        else:
            lines.append(f"{role}: {content}")
    return "\n".join(lines)


def parse_critic_reply(text: str, n_turns: int, max_hints: int, max_chars: int) -> list[Hint]:
    match = re.search(r"\[.*\]", text, flags=re.S)
    if not match:
        return []
    try:
        items = json.loads(match.group(0))
    except ValueError:
        return []
    hints: list[Hint] = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        turn, hint = item.get("turn"), item.get("hint")
        if (
            isinstance(turn, int)
            and not isinstance(turn, bool)
            and 0 <= turn < n_turns
            and isinstance(hint, str)
            and hint.strip()
        ):
            hints.append(Hint(turn=turn, text=hint.strip()[:max_chars], kind="critic"))
        if len(hints) >= max_hints:
            break
    return hints


def critic(traj: Trajectory, config: CriticConfig, errors: list[str] | None = None) -> list[Hint]:
    """Query the critic; failures are appended to ``errors`` and give no hints."""
    if not config.base_url or not traj.turns:
        return []
    body = {
        "model": config.model,
        "messages": [
            {"role": "system", "content": CRITIC_PROMPT},
            {"role": "user", "content": render_for_critic(traj)},
        ],
        "temperature": 0.0,
    }
    headers = {"Content-Type": "application/json"}
    key = os.environ.get(config.api_key_env, "") if config.api_key_env else ""
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(
        config.base_url.rstrip("/") + "/chat/completions",
        data=json.dumps(body).encode(),
        headers=headers,
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=config.timeout_s) as resp:
            reply: dict[str, Any] = json.loads(resp.read().decode("utf-8", "replace"))
        content = reply["choices"][0]["message"]["content"] or ""
    except (urllib.error.URLError, TimeoutError, OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        if errors is not None:
            errors.append(f"critic at {config.base_url} failed: {exc}")
        return []
    turns = {t.index for t in traj.turns}
    return [
        h
        for h in parse_critic_reply(content, max(turns) + 1, config.max_hints, config.max_chars)
        if h.turn in turns
    ]
