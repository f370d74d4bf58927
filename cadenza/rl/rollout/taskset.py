"""The trainer's environment source over a real task set: curriculum sampling, sandboxed episodes.

``[env] name = "taskset"`` in a train config plugs this in. Each step the curriculum picks the
tasks (see :mod:`cadenza.rl.rollout.curriculum`), every rollout is a sandboxed
:class:`cadenza.agent.episode.Episode`, and after grading the trainer hands the outcomes back
through :meth:`TaskSetSource.record`, one pool transaction per group. When the pool goes easy,
the factory is asked for harder tasks from the same sources in the background.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from cadenza.errors import ConfigError
from cadenza.rl.rollout.curriculum import CurriculumConfig, CurriculumSampler, Escalator, pool_metrics
from cadenza.tasks.pool import AttemptResult, PoolConfig, TaskPool


@dataclass(frozen=True)
class TaskRef:
    id: str
    dir: Path


@dataclass(kw_only=True)
class GroupOutcome:
    """One rollout's outcome as the pool records it."""

    task_id: str
    reward: float
    resolved: bool
    flagged: bool


@dataclass(kw_only=True)
class TaskSetOptions:
    """``[env.options]`` for ``name = "taskset"``."""

    task_set: str
    max_turns: int = 8
    time_budget_s: float = 300.0
    escalate: bool = True
    factory_workers: int = 1
    template_tools: bool = (
        False  # also render the tool schemas through the chat template (the system prompt lists them already)
    )
    curriculum: dict[str, Any] = field(default_factory=dict)
    pool: dict[str, Any] = field(default_factory=dict)


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(
            f"unknown key(s) {', '.join(unknown)} in {where}; known: {', '.join(sorted(known))}"
        )
    try:
        return cls(**data)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def factory_for(task_set: Path, workers: int = 1):
    """A curriculum factory backed by the real task factory: harder tasks from ``source`` into the set."""

    def make(source: str, level: int, n: int) -> list[tuple[str, str, int]]:
        from cadenza.tasks.factory import BuildConfig, build_source
        from cadenza.tasks.store import TaskStore

        before = {r["id"] for r in TaskStore(task_set).rows()}
        cfg = BuildConfig(
            out=task_set, workers=workers, max_tasks=n, levels=(level,), seed=level, progress=False
        )
        report = build_source(source, cfg)
        rows = [r for r in TaskStore(task_set).rows() if r["id"] not in before]
        if not rows and report.status != "done":
            raise ConfigError(f"factory could not build level-{level} tasks from {source}: {report.reason}")
        return [(r["id"], r["spec"], int(r["level"])) for r in rows]

    return make


class TaskSetSource:
    """Implements the trainer's EnvSource protocol (``sample_tasks``/``make_env``) plus
    ``record``/``metrics``."""

    def __init__(self, options: TaskSetOptions, seed: int = 0) -> None:
        from cadenza.tasks.store import TaskStore

        self.options = options
        self.root = Path(options.task_set)
        store = TaskStore(self.root)
        self.pool = TaskPool(self.root, _build(PoolConfig, options.pool, "[env.options.pool]"))
        self.curriculum = _build(CurriculumConfig, options.curriculum, "[env.options.curriculum]")
        rows = store.rows()
        self.pool.add_tasks([(r["id"], r["spec"], int(r["level"])) for r in rows])
        self.sampler = CurriculumSampler(self.pool, self.curriculum, seed=seed)
        self.escalator = (
            Escalator(
                pool_path=str(self.pool.path),
                factory=factory_for(self.root, options.factory_workers),
                config=self.curriculum,
            )
            if options.escalate
            else None
        )
        self.zero_variance_groups = 0
        self.run_id = "run"  # the trainer sets one per run directory: group ids never collide across runs

    def sample_tasks(self, rng: random.Random, n: int, start_index: int = 0) -> list[TaskRef]:
        self.sampler.rng = rng  # the trainer seeds per step: a resumed run draws the same tasks
        return [TaskRef(t, self.root / t) for t in self.sampler.sample(n)]

    def make_env(self, task: TaskRef) -> Any:
        from cadenza.agent.episode import Episode, EpisodeConfig

        env = Episode(
            task.dir,
            EpisodeConfig(max_turns=self.options.max_turns, time_budget_s=self.options.time_budget_s),
        )
        env.show_tools = self.options.template_tools  # the trainer honours it; halves the prompt by default
        return env

    def record(self, step: int, outcomes: Sequence[GroupOutcome]) -> dict[str, Any]:
        """Write each task's group to the pool (idempotent per run and step), maybe escalate; returns
        metrics."""
        groups: dict[str, list[GroupOutcome]] = defaultdict(list)
        for o in outcomes:
            groups[o.task_id].append(o)
        for task_id, rows in groups.items():
            self.pool.record_group(
                task_id,
                f"{self.run_id}-step{step}-{task_id}",
                step,
                [
                    AttemptResult(success=o.resolved and not o.flagged, reward=o.reward, flagged=o.flagged)
                    for o in rows
                ],
            )
            if len({o.reward for o in rows}) <= 1:
                self.zero_variance_groups += 1
        escalated = self.escalator.maybe_escalate(self.pool, step) if self.escalator else None
        done = self.escalator.drain() if self.escalator else []
        return {
            **pool_metrics(self.pool, self.curriculum),
            "zero_variance_groups_total": self.zero_variance_groups,
            "escalation_started": escalated,
            "escalation_added": sum(r.added for r in done),
            "escalation_failed": sum(r.error is not None for r in done),
        }  # details: pool_events


def make_source(options: dict[str, Any]) -> TaskSetSource:
    seed = int(options.pop("seed", 0)) if "seed" in options else 0
    return TaskSetSource(_build(TaskSetOptions, options, "[env.options]"), seed=seed)
