"""Capacity model: how many CPU cores of workers a run needs, from measured per-unit costs.

The run is a pipeline of three stages that must keep up with each other: engines generate tokens,
CPU workers run sandboxed tool calls and grade, the trainer consumes a batch per step. Each stage's
throughput is a per-unit cost times a count; the slowest stage sets the run's pace, and the worker
cores needed are what keeps the workers from being that stage. ``python -m cadenza.scale --help``.

The task-build cost defaults to the figure measured here (``bench/tasks_build.py``); the other
defaults are illustrative GPU-cluster assumptions, not measurements: pass your own (docs/scale.md lists
what was measured on the 2-core reference machine; ``bench/scale.py`` checks the predictions against
a local Ray cluster).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields


@dataclass(kw_only=True)
class UnitCosts:
    """Costs of one unit of work (replace the defaults with your own measurements)."""

    build_core_s_per_task: float = 5.2
    """Core-seconds to build one validated task (measured: bench/tasks_build.py, ~11.6 tasks per
    core-minute on cachetools and toolz with validation in bubblewrap)."""
    sandbox_core_s_per_episode: float = 2.0
    """Core-seconds of sandboxed tool execution per episode (tests run by the agent, shells); assumed."""
    grade_core_s_per_episode: float = 1.5
    """Core-seconds to grade one episode (fresh copy + the task's test selection); assumed."""
    tokens_per_episode: int = 6000
    """Generated tokens per episode (all turns); assumed."""
    engine_tokens_per_s: float = 2500.0
    """Generated tokens per second of one engine GPU at the batch sizes of the run; assumed."""
    trainer_s_per_step: float = 30.0
    """Seconds one optimizer step takes on the trainer GPUs for ``episodes_per_step`` episodes; assumed."""


@dataclass(kw_only=True)
class Demand:
    """The run being planned."""

    trainer_gpus: int = 8
    engine_gpus: int = 8
    episodes_per_step: int = 256
    new_tasks_per_hour: float = 0.0
    """Tasks the factory must add per hour (curriculum refresh), built on the same worker pool."""


def plan(costs: UnitCosts, demand: Demand) -> dict[str, float]:
    """Episodes/minute each stage can sustain, the bottleneck, and the worker cores that match."""
    for name, value in (*asdict(costs).items(), *asdict(demand).items()):
        if value < 0 or (name in ("trainer_gpus", "engine_gpus", "episodes_per_step") and value < 1):
            raise ValueError(f"{name} must be positive, got {value}")
    trainer_epm = demand.episodes_per_step / costs.trainer_s_per_step * 60
    engine_epm = demand.engine_gpus * costs.engine_tokens_per_s / costs.tokens_per_episode * 60
    pace = min(trainer_epm, engine_epm)
    core_s = costs.sandbox_core_s_per_episode + costs.grade_core_s_per_episode
    rollout_cores = pace * core_s / 60
    build_cores = demand.new_tasks_per_hour * costs.build_core_s_per_task / 3600
    return {
        "trainer_episodes_per_min": round(trainer_epm, 2),
        "engine_episodes_per_min": round(engine_epm, 2),
        "bottleneck": "trainer" if trainer_epm <= engine_epm else "engine",
        "episodes_per_min": round(pace, 2),
        "rollout_worker_cores": math.ceil(rollout_cores),
        "task_build_cores": math.ceil(build_cores),
        "worker_cores": math.ceil(rollout_cores + build_cores),
    }


def predict_tasks_per_min(costs: UnitCosts, workers: int) -> float:
    """Task-building throughput of ``workers`` single-core workers (no other bottleneck)."""
    return workers * 60 / costs.build_core_s_per_task


def predict_build_seconds(sources: Sequence[tuple[float, float]], workers: int) -> float:
    """Wall seconds to build ``sources``, each ``(prepare_s, candidates_s)`` as measured on one worker,
    with ``workers`` workers scheduled as the factory does: sources first (a worker each), spare
    workers to the candidates of a source. A source's own work (fetch, base env, baseline + coverage)
    runs once on one worker; only the validation of its candidates splits (Amdahl's law). Many more
    sources than workers make the per-task rate of :func:`predict_tasks_per_min` the steady state."""
    if workers < 1 or not sources:
        raise ValueError(f"need >= 1 worker and >= 1 source, got {workers} and {len(sources)}")
    whole = [prepare + candidates for prepare, candidates in sources]
    if workers <= len(sources):  # every worker on whole sources: at best evenly balanced
        return max(max(whole), sum(whole) / workers)
    per_source = workers // len(sources)
    return max(prepare + candidates / per_source for prepare, candidates in sources)


def predict_episodes_per_min(costs: UnitCosts, workers: int, engine_s_per_episode: float) -> float:
    """Episode throughput of ``workers`` single-core workers sharing an engine that needs
    ``engine_s_per_episode`` of its time per episode: the slower of the two."""
    worker = workers * 60 / (costs.sandbox_core_s_per_episode + costs.grade_core_s_per_episode)
    engine = 60 / engine_s_per_episode if engine_s_per_episode > 0 else math.inf
    return min(worker, engine)


def scale_measured_episodes(
    one_worker_per_min: float, workers: int, core_s_per_episode: float, cores: int
) -> float:
    """Episodes/minute of ``workers`` workers from one worker's measured rate: ``workers`` times it, but
    never more than ``cores`` can serve at ``core_s_per_episode`` (all the CPU an episode costs: the
    model, the sandboxed tool calls, the grading). One worker's episode may keep more than one core
    busy (a sandboxed pytest run beside the model, the fail-to-pass rerun beside the main run), so on a
    small machine the cores, not the workers, set the ceiling (measured: bench/scale.py)."""
    if workers < 1 or cores < 1 or one_worker_per_min < 0 or core_s_per_episode <= 0:
        raise ValueError(
            f"need workers, cores >= 1, a rate >= 0 and core seconds > 0; got {workers}, {cores}, "
            f"{one_worker_per_min}, {core_s_per_episode}"
        )
    return min(workers * one_worker_per_min, cores * 60 / core_s_per_episode)


def _add(parser: argparse.ArgumentParser, cls: type) -> None:
    for f in fields(cls):
        parser.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m cadenza.scale", description=__doc__.splitlines()[0])
    _add(parser, UnitCosts)
    _add(parser, Demand)
    args = vars(parser.parse_args(argv))
    pick = lambda cls: cls(**{f.name: args[f.name] for f in fields(cls)})  # noqa: E731
    try:
        print(json.dumps(plan(pick(UnitCosts), pick(Demand))))
    except ValueError as exc:
        parser.exit(2, f"error: {exc}\n")


if __name__ == "__main__":
    main()
