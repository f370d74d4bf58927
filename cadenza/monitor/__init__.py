"""Reward-hacking detectors over trajectories.

``monitor(trajectory, task=..., judge=...)`` returns the flags; ``apply_monitor`` stores them on the
trajectory and zeroes the reward when any fired. Rules live in :mod:`cadenza.monitor.rules`; the
optional LLM judge in :mod:`cadenza.monitor.judge` only adds flags.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from cadenza.agent.trajectory import Flag, Trajectory
from cadenza.monitor.events import Extractor, tool_calls
from cadenza.monitor.judge import JudgeConfig
from cadenza.monitor.judge import judge as run_judge
from cadenza.monitor.rules import RULES, Context, Rule
from cadenza.tasks.records.task import Task

__all__ = ["RULES", "JudgeConfig", "Rule", "apply_monitor", "monitor"]

log = logging.getLogger(__name__)
EVIDENCE_CHARS = 240


def _excerpt(reason: str, raw: str) -> str:
    raw = " ".join(raw.split())
    if len(raw) > EVIDENCE_CHARS:
        raw = raw[: EVIDENCE_CHARS - 3] + "..."
    return f"{reason}: {raw}"


def monitor(
    trajectory: Trajectory,
    *,
    task: Task | None = None,
    judge: JudgeConfig | None = None,
    rules: Sequence[Rule] = RULES,
) -> list[Flag]:
    """Flags for every rule that fires, at most one per (rule, turn), in turn order.

    A rule that raises is logged with its traceback and reported as a ``monitor_error`` flag (which
    also withholds the reward: an unreadable call must not pay), never folded into another rule.
    """
    ctx = Context.build(
        task,
        workspace=str(trajectory.meta.get("workspace") or ""),
        package_capabilities=frozenset(trajectory.meta.get("package_capabilities") or ()),
    )
    extractor = Extractor()
    flags: list[Flag] = []
    seen: set[tuple[str, int]] = set()

    def add(rule: str, turn: int, reason: str, raw: str) -> None:
        if (rule, turn) not in seen:
            seen.add((rule, turn))
            flags.append(Flag(rule=rule, turn=turn, evidence=_excerpt(reason, raw)))

    for call in tool_calls(trajectory):
        try:
            for event in extractor.events(call):
                for rule in rules:
                    try:
                        reason = rule.check(event, ctx)
                    except Exception as exc:
                        log.exception("monitor rule %s raised on turn %d", rule.name, call.turn)
                        add(
                            "monitor_error",
                            call.turn,
                            f"rule {rule.name} raised {type(exc).__name__}: {exc}",
                            call.raw,
                        )
                        continue
                    if reason:
                        add(rule.name, call.turn, reason, event.raw or call.raw)
                ctx.observe(event)
        except (
            RecursionError,
            MemoryError,
            ValueError,
            TypeError,
            IndexError,
            KeyError,
            AttributeError,
        ) as exc:
            # Fail closed: input built to break the reader is itself a reason to withhold the reward.
            add(
                "obfuscation", call.turn, f"monitor could not read this call ({type(exc).__name__})", call.raw
            )
    if judge is not None:
        result = run_judge(trajectory, judge, task.statement if task else "")
        if result.error:
            log.warning("LLM judge unavailable, rules only: %s", result.error)
            trajectory.meta["judge_error"] = result.error
        flags.extend(result.flags)
    return flags


def apply_monitor(
    trajectory: Trajectory, *, task: Task | None = None, judge: JudgeConfig | None = None
) -> list[Flag]:
    """Run :func:`monitor`, keep the flags on the trajectory and set reward 0 when any fired."""
    flags = monitor(trajectory, task=task, judge=judge)
    trajectory.flags = [f for f in trajectory.flags if f.source not in ("rules", "llm_judge")] + flags
    if trajectory.flags:
        if trajectory.reward:
            trajectory.meta["reward_before_monitor"] = trajectory.reward
        trajectory.reward = 0.0
        if isinstance(trajectory.outcome, dict):
            trajectory.outcome["reward"] = 0.0
            trajectory.outcome["flagged"] = True
    return flags
