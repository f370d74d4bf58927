"""Pass-rate curriculum: sample where the GRPO signal is, drop signal-free groups, ask for harder tasks.

GRPO learns nothing from a group whose rollouts all succeed or all fail (zero advantage), and the
expected signal of a task with pass rate p scales with p(1-p), largest at p = 0.5. The sampler
therefore draws, per step, the tasks whose pass rate is closest to a target. It uses Thompson
sampling on each task's Beta posterior: an unseen task (a flat posterior) gets a fair chance by
construction, and a task with few attempts is explored in proportion to its uncertainty.

When the pool has gone easy (mean pass rate above a threshold, or too few tasks near the target),
the :class:`Escalator` asks a factory for harder tasks from the same sources in a background
thread; training never waits for it.
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cadenza.errors import CadenzaError, need
from cadenza.tasks.pool import TaskPool, TaskStats


class PoolExhausted(CadenzaError):
    """No active task is left to sample."""


@dataclass(kw_only=True)
class CurriculumConfig:
    """Knobs of the curriculum (all documented in docs/curriculum.md).

    ``target``: pass rate to sample around. ``unseen_share``: at most this share of a batch is
    spent on tasks never attempted. ``confirm_share``: up to this share re-samples tasks whose every
    group so far was all-success or all-failure but that have fewer than the pool's retire window of
    groups, so that solved and impossible tasks get retired instead of lingering (Thompson sampling
    alone would stop drawing them). The rest is Thompson-sampled. ``near_band``: a task is "near
    the target" when its posterior mean is within this distance. Escalation fires when the active
    pool's mean pass rate exceeds ``escalate_mean_pass`` or the share of active tasks near the target
    drops below ``escalate_min_near_share`` (once ``escalate_min_groups`` groups were recorded),
    at most once every ``escalate_cooldown_steps`` steps.
    """

    target: float = 0.5
    unseen_share: float = 0.25
    confirm_share: float = 0.25
    near_band: float = 0.2
    escalate_mean_pass: float = 0.7
    escalate_min_near_share: float = 0.2
    escalate_min_groups: int = 8
    escalate_cooldown_steps: int = 5
    escalate_tasks: int = 8
    max_level: int = 3

    def __post_init__(self) -> None:
        need(0.0 < self.target < 1.0, f"curriculum target must be in (0, 1), got {self.target}")
        for name in (
            "unseen_share",
            "confirm_share",
            "near_band",
            "escalate_mean_pass",
            "escalate_min_near_share",
        ):
            value = getattr(self, name)
            need(0.0 <= value <= 1.0, f"curriculum {name} must be in [0, 1], got {value}")
        for name in ("escalate_min_groups", "escalate_cooldown_steps", "escalate_tasks", "max_level"):
            value = getattr(self, name)
            need(
                isinstance(value, int) and value >= 0,
                f"curriculum {name} must be an integer >= 0, got {value!r}",
            )


class CurriculumSampler:
    """Draws task ids for a training step from the active pool."""

    def __init__(self, pool: TaskPool, config: CurriculumConfig | None = None, seed: int = 0) -> None:
        self.pool = pool
        self.config = config or CurriculumConfig()
        self.rng = random.Random(seed)

    def sample(self, n: int) -> list[str]:
        """Up to ``n`` distinct active tasks, the unseen first (up to ``unseen_share``), then nearest the
        target."""
        active = self.pool.stats(state="active")
        if not active:
            counts = {s.state: 0 for s in self.pool.stats()}
            for s in self.pool.stats():
                counts[s.state] += 1
            detail = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "the pool is empty"
            raise PoolExhausted(
                f"no active task to sample ({detail}); add tasks with 'cadenza tasks build' or enable "
                "escalation"
            )
        unseen = [s for s in active if s.attempts == 0]
        seen = [s for s in active if s.attempts > 0]
        self.rng.shuffle(unseen)
        n_unseen = min(len(unseen), max(round(n * self.config.unseen_share), 0 if seen else n))
        chosen = [s.task_id for s in unseen[:n_unseen]]
        window = self.pool.config.retire_window
        extreme = [s for s in seen if s.groups < window and s.successes in (0, s.attempts)]
        self.rng.shuffle(extreme)
        n_confirm = min(len(extreme), math.ceil(n * self.config.confirm_share), n - len(chosen))
        chosen += [s.task_id for s in extreme[:n_confirm]]
        taken = set(chosen)
        rest = [s for s in seen + unseen[n_unseen:] if s.task_id not in taken]
        scored = sorted(rest, key=lambda s: abs(self.rng.betavariate(s.alpha, s.beta) - self.config.target))
        chosen += [s.task_id for s in scored[: n - len(chosen)]]
        return chosen


def drop_zero_variance(groups: Sequence[Sequence[float]]) -> tuple[list[int], int]:
    """Indices of groups whose rewards vary (they carry a GRPO signal), and how many were dropped."""
    keep = [i for i, rewards in enumerate(groups) if len(rewards) > 1 and max(rewards) - min(rewards) > 1e-12]
    return keep, len(groups) - len(keep)


@dataclass(kw_only=True)
class PoolSummary:
    active: int
    by_state: dict[str, int]
    mean_pass: float | None
    near_target_share: float | None
    groups: int


def summarize(pool: TaskPool, config: CurriculumConfig) -> PoolSummary:
    stats = pool.stats()
    by_state: dict[str, int] = {}
    for s in stats:
        by_state[s.state] = by_state.get(s.state, 0) + 1
    seen = [s for s in stats if s.state == "active" and s.attempts > 0]
    mean_pass = sum(s.mean for s in seen) / len(seen) if seen else None
    near = sum(abs(s.mean - config.target) <= config.near_band for s in seen) / len(seen) if seen else None
    return PoolSummary(
        active=by_state.get("active", 0),
        by_state=by_state,
        mean_pass=mean_pass,
        near_target_share=near,
        groups=sum(s.groups for s in stats),
    )


# A factory makes up to ``n`` new tasks at ``level`` from ``source`` and returns (task_id, source, level)
# rows.
Factory = Callable[[str, int, int], list[tuple[str, str, int]]]


@dataclass(kw_only=True)
class EscalationResult:
    step: int
    source: str
    level: int
    added: int
    error: str | None = None


@dataclass(kw_only=True)
class Escalator:
    """Asks ``factory`` for harder tasks in a background thread when the pool has gone easy."""

    pool_path: str
    factory: Factory
    config: CurriculumConfig = field(default_factory=CurriculumConfig)
    _thread: threading.Thread | None = None
    _last_step: int | None = None
    _results: list[EscalationResult] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def reason(self, pool: TaskPool) -> str | None:
        """Why the pool needs harder tasks now, or None."""
        s = summarize(pool, self.config)
        if s.groups < self.config.escalate_min_groups or s.mean_pass is None:
            return None
        if s.mean_pass > self.config.escalate_mean_pass:
            return f"mean pass rate {s.mean_pass:.2f} > {self.config.escalate_mean_pass}"
        if s.near_target_share is not None and s.near_target_share < self.config.escalate_min_near_share:
            return f"only {s.near_target_share:.0%} of active tasks near the target"
        return None

    def maybe_escalate(self, pool: TaskPool, step: int) -> str | None:
        """Start a background escalation if needed and none is running; returns the reason when started."""
        if self.running:
            return None
        if self._last_step is not None and step - self._last_step < self.config.escalate_cooldown_steps:
            return None
        why = self.reason(pool)
        if why is None:
            return None
        plan = self._plan(pool)
        if not plan:
            pool.log_event(
                step,
                "escalation_skipped",
                {"reason": why, "detail": f"every source is at level {self.config.max_level}"},
            )
            self._last_step = step
            return None
        pool.log_event(step, "escalation", {"reason": why, "plan": plan})
        self._last_step = step
        self._thread = threading.Thread(
            target=self._run, args=(plan, step), daemon=True, name="cadenza-escalate"
        )
        self._thread.start()
        return why

    def _plan(self, pool: TaskPool) -> list[tuple[str, int]]:
        """Sources whose tasks have gone easiest, each with the next level to ask for."""
        per_source: dict[str, list[TaskStats]] = {}
        for s in pool.stats():
            per_source.setdefault(s.source, []).append(s)
        plan = []
        for source, rows in per_source.items():
            top = max(r.level for r in rows)
            seen = [r for r in rows if r.attempts > 0]
            ease = sum(r.mean for r in seen) / len(seen) if seen else 0.0
            if top < self.config.max_level and seen and ease > self.config.target:
                plan.append((ease, source, top + 1))
        plan.sort(reverse=True)
        return [(src, lv) for _, src, lv in plan]

    def _run(self, plan: list[tuple[str, int]], step: int) -> None:
        # A separate connection: SQLite connections must not cross threads.
        with TaskPool(self.pool_path) as pool:
            per = max(1, self.config.escalate_tasks // max(1, len(plan)))
            for source, level in plan:
                try:
                    rows = self.factory(source, level, per)
                    added = pool.add_tasks(rows, step=step)
                    result = EscalationResult(step=step, source=source, level=level, added=added)
                except Exception as exc:  # the factory may fail on a source; training goes on
                    result = EscalationResult(
                        step=step, source=source, level=level, added=0, error=f"{type(exc).__name__}: {exc}"
                    )
                pool.log_event(
                    step,
                    "escalation_done",
                    {"source": source, "level": level, "added": result.added, "error": result.error},
                )
                with self._lock:
                    self._results.append(result)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def drain(self) -> list[EscalationResult]:
        """Results finished since the last call."""
        with self._lock:
            out, self._results = self._results, []
        return out


def pool_metrics(pool: TaskPool, config: CurriculumConfig) -> dict[str, Any]:
    """What the trainer logs per step about the pool."""
    s = summarize(pool, config)
    return {
        "pool_active": s.active,
        "pool_mean_pass": s.mean_pass,
        "pool_near_target": s.near_target_share,
        **{f"pool_{k}": v for k, v in s.by_state.items() if k != "active"},
    }
