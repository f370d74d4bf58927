"""Trajectory format: OpenAI chat messages plus per-turn metadata, JSON-serialisable.

A *turn* is one assistant message (and the tool results that answer it). ``TurnMeta.message_index``
points at that assistant message in ``messages``. ``error_kind`` is machine-readable so the
feedback stage can key on it (``tool_not_found``, ``invalid_arguments``, ``path_outside_workspace``,
``tool_error``, ``timeout``, ``no_tool_call`` for an assistant message without a tool call; ``None`` when
the call worked).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cadenza.jsonio import atomic_write_text

ERROR_KINDS = (
    "tool_not_found",
    "invalid_arguments",
    "path_outside_workspace",
    "tool_error",
    "timeout",
    "no_tool_call",
)


@dataclass(kw_only=True)
class Flag:
    """A monitor finding: which rule fired, at which turn, and the evidence (a short excerpt)."""

    rule: str
    turn: int
    evidence: str
    source: str = "rules"  # "rules" or "llm_judge"


@dataclass(kw_only=True)
class TurnMeta:
    index: int
    message_index: int
    tool: str | None = None
    arguments: dict[str, Any] | None = None
    error_kind: str | None = None
    exit_code: int | None = None
    duration_s: float = 0.0
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    hints: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(kw_only=True)
class Trajectory:
    task_id: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    turns: list[TurnMeta] = field(default_factory=list)
    outcome: dict[str, Any] | None = None
    reward: float | None = None
    flags: list[Flag] = field(default_factory=list)
    sandboxed: bool = True
    meta: dict[str, Any] = field(default_factory=dict)

    def add_turn(self, message: dict[str, Any], **meta: Any) -> TurnMeta:
        """Append the assistant ``message`` and its turn, whose indices point at it."""
        self.messages.append(message)
        turn = TurnMeta(index=len(self.turns), message_index=len(self.messages) - 1, **meta)
        self.turns.append(turn)
        return turn

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        data = dict(data)
        turns = [TurnMeta(**t) for t in data.pop("turns", [])]
        flags = [Flag(**f) for f in data.pop("flags", [])]
        return cls(turns=turns, flags=flags, **data)

    def save(self, path: str | Path) -> None:
        atomic_write_text(path, json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Trajectory:
        return cls.from_dict(json.loads(Path(path).read_text()))
