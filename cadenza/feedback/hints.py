"""A hint: short text inserted into one turn's context to build the self-distillation teacher."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

# none: the teacher sees the student's own context (a control: the same turns get SD, with no words)
Placement = Literal["user_before_turn", "append_to_observation", "none"]


@dataclass(frozen=True, kw_only=True)
class Hint:
    """``turn`` indexes the assistant turn the hint improves (``TurnMeta.index``); ``kind`` names the
    generator."""

    turn: int
    text: str
    kind: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
