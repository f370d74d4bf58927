"""The one typed outcome of an episode: graded once and monitored once, with the task's context.

:class:`~cadenza.agent.episode.Episode` is its only producer. Everything downstream (the RL trainer and
its task pool, ``cadenza eval``, ``cadenza replay``) reads this object, or its :meth:`Outcome.to_dict`
form stored on the trajectory, and never re-grades or re-monitors: a second, weaker pass (one without
the task) is how a flagged episode used to count as a pool success.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cadenza.agent.trajectory import Flag


@dataclass(kw_only=True)
class Outcome:
    """``reward`` is 1.0 only when ``resolved`` and no flag fired; ``tests`` maps node ID -> outcome."""

    reward: float
    resolved: bool
    tests: dict[str, str] = field(default_factory=dict)
    flags: list[Flag] = field(default_factory=list)
    end_reason: str = "finished"
    f2p: tuple[int, int] = (0, 0)  # (passed, total)
    p2p: tuple[int, int] = (0, 0)
    turns: int = 0
    duration_s: float = 0.0
    grade: dict[str, Any] = field(default_factory=dict)  # the full GradeResult, for reports

    def __post_init__(self) -> None:
        assert not (self.flags and self.reward), "a flagged outcome never pays"

    @property
    def flagged(self) -> bool:
        return bool(self.flags)

    @property
    def success(self) -> bool:
        """What a task pool counts as solved: resolved and unflagged."""
        return self.resolved and not self.flagged

    def to_dict(self) -> dict[str, Any]:
        return {
            "resolved": self.resolved,
            "reward": self.reward,
            "f2p": {"passed": self.f2p[0], "total": self.f2p[1]},
            "p2p": {"passed": self.p2p[0], "total": self.p2p[1]},
            "flags": [
                {"rule": f.rule, "turn": f.turn, "evidence": f.evidence, "source": f.source}
                for f in self.flags
            ],
            "turns": self.turns,
            "end_reason": self.end_reason,
            "duration_s": self.duration_s,
            "tests": dict(self.tests),
            "grade": self.grade,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Outcome:
        """Read a stored outcome (``Trajectory.outcome``); missing parts default to a failed, unflagged
        one."""
        flags = [
            Flag(
                rule=f["rule"],
                turn=int(f.get("turn", 0)),
                evidence=f.get("evidence", ""),
                source=f.get("source", "rules"),
            )
            for f in data.get("flags") or []
        ]
        f2p, p2p = data.get("f2p") or {}, data.get("p2p") or {}
        return cls(
            reward=0.0 if flags else float(data.get("reward", 0.0)),
            resolved=bool(data.get("resolved", False)),
            tests=dict(data.get("tests") or (data.get("grade") or {}).get("tests") or {}),
            flags=flags,
            end_reason=str(data.get("end_reason", "finished")),
            f2p=(int(f2p.get("passed", 0)), int(f2p.get("total", 0))),
            p2p=(int(p2p.get("passed", 0)), int(p2p.get("total", 0))),
            turns=int(data.get("turns", 0)),
            duration_s=float(data.get("duration_s", 0.0)),
            grade=dict(data.get("grade") or {}),
        )
