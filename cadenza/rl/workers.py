"""Rollout workers: one (task, group) unit at a time, in this process or in Ray actors.

A unit is "step s, task i of that step". It is rolled out with its own generator, seeded from
``(seed, s, i)``, as its own batch, then graded, monitored and annotated with hints where it ran, so
its episodes are the same whether a :class:`LocalWorkers` or a :class:`RayWorkers` ran it. Each
Ray actor owns its environments (and their bubblewrap sandboxes) and an engine: its own ``hf``
copy, whose weights the driver pushes once per version through the object store, or a client of
the served engine(s) the trainer keeps in sync (``vllm``/``openai``).

Faults: an actor that dies mid-unit is replaced (and brought to the current weights) and the unit
is re-run elsewhere up to ``max_retries`` times; past that it is lost. Both are counted. Every wait
has a timeout: a unit or a weight push that does not finish in ``timeout_s`` stops the run with
one line.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from cadenza.errors import CadenzaError
from cadenza.executor import ExecutorConfig
from cadenza.rl.episodes import TrainEpisode, collect_episodes, step_seed


@dataclass(kw_only=True)
class Unit:
    step: int
    index: int  # position of the task in its step (its GRPO group id prefix)
    task: Any


def unit_seed(cfg: Any, step: int, index: int) -> int:
    return step_seed(cfg, step) * 10_007 + index


@dataclass(kw_only=True)
class WorkerCounts:
    units: int = 0
    retried: int = 0  # re-run after their worker died
    lost: int = 0  # their worker died on every try; their episodes are missing from the step
    restarts: int = 0  # actors replaced


class RolloutWorker:
    """What one worker holds: env source, tokenizer, monitor, engine. Also the body of a Ray actor."""

    def __init__(self, cfg: Any, *, threads: int = 1) -> None:
        from cadenza.rl.build import build_policy
        from cadenza.rl.engines.hf import HFEngine
        from cadenza.rl.envs import load_source

        torch.set_num_threads(threads)
        self.cfg = cfg
        self.tokenizer, policy = build_policy(cfg)
        self.source = load_source(cfg.env.name, cfg.env.options)
        if cfg.rollout.engine != "hf":
            raise CadenzaError(
                f"rollout workers with engine {cfg.rollout.engine!r} are not built yet; use engine = 'hf'"
            )
        self.engine = HFEngine(policy, share=True)

    def sync(self, state: dict[str, torch.Tensor], version: int) -> int:
        self.engine.sync_weights(state.items(), version=version)
        return version

    def run(self, unit: Unit) -> list[TrainEpisode]:
        seed = unit_seed(self.cfg, unit.step, unit.index)
        return collect_episodes(
            self.engine,
            self.tokenizer,
            self.source,
            self.cfg,
            unit.step,
            [unit.task],
            seed=seed,
            group_offset=unit.index,
        )

    def pid(self) -> int:
        import os

        return os.getpid()


def _state(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in named}


class LocalWorkers:
    """Units run one after the other in this process (the reference for :class:`RayWorkers`)."""

    name = "local"

    def __init__(self, cfg: Any) -> None:
        self.worker = RolloutWorker(cfg, threads=torch.get_num_threads())
        self.counts = WorkerCounts()

    def sync(self, named: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        self.worker.sync(_state(named), version)

    def run(self, units: list[Unit]) -> list[list[TrainEpisode] | None]:
        self.counts.units += len(units)
        return [self.worker.run(u) for u in units]

    def close(self) -> None:
        pass


@dataclass(kw_only=True)
class _Slot:
    actor: Any
    busy: Any = None  # (ref, position, tries) while a unit runs


class RayWorkers:
    """``n`` Ray actors pulling units; the bounded in-flight window is one unit per actor."""

    name = "ray"

    def __init__(self, cfg: Any, n: int, executor: ExecutorConfig, *, timeout_s: float = 600.0) -> None:
        from cadenza.executor.ray import RayExecutor

        if n < 1:
            raise CadenzaError(f"rollout workers must be >= 1, got {n}")
        self.cfg, self.timeout_s, self.max_retries = cfg, timeout_s, executor.max_retries
        self.counts = WorkerCounts()
        self._ex = RayExecutor(executor)
        self._weights: tuple[Any, int] | None = None
        try:
            self.slots = [self._new_slot() for _ in range(n)]
            self._get([s.actor.pid.remote() for s in self.slots], "start")
        except BaseException:
            self._ex.close()
            raise

    def _new_slot(self) -> _Slot:
        actor = self._ex.actor(RolloutWorker, self.cfg, num_cpus=1)
        slot = _Slot(actor=actor)
        if self._weights is not None:
            ref, version = self._weights
            self._get([actor.sync.remote(ref, version)], f"weight push to version {version}")
        return slot

    def _get(self, refs: list[Any], what: str) -> list[Any]:
        import ray

        try:
            return ray.get(refs, timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise CadenzaError(
                f"rollout workers did not finish a {what} within {self.timeout_s:g} s; check `ray status`"
            ) from None

    # the engine face the trainer's pipeline sees: versions and weight pushes; sampling goes through units
    @property
    def version(self) -> int:
        return -1 if self._weights is None else self._weights[1]

    def sync_weights(self, named: Iterable[tuple[str, torch.Tensor]], *, version: int) -> None:
        self.sync(named, version)

    def sample(self, *args: Any, **kwargs: Any) -> Any:
        raise CadenzaError("Ray rollout workers sample inside their actors; call run(units)")

    def pids(self) -> list[int]:
        return self._get([s.actor.pid.remote() for s in self.slots], "pid query")

    def sync(self, named: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Put the weights in the object store once; every actor loads them (one copy per node)."""
        import ray

        ref = ray.put(_state(named))
        self._weights = (ref, version)
        self._get(
            [s.actor.sync.remote(ref, version) for s in self.slots], f"weight push to version {version}"
        )

    def run(self, units: list[Unit]) -> list[list[TrainEpisode] | None]:
        """Every unit's episodes, in unit order (``None`` for a lost unit)."""
        import ray

        results: list[list[TrainEpisode] | None] = [None] * len(units)
        todo = [(pos, 0) for pos in range(len(units))]  # (position, tries so far)
        self.counts.units += len(units)
        deadline = time.monotonic() + self.timeout_s * max(1, len(units))
        while todo or any(s.busy for s in self.slots):
            for slot in self.slots:
                if slot.busy is None and todo:
                    pos, tries = todo.pop(0)
                    slot.busy = (slot.actor.run.remote(units[pos]), pos, tries)
            refs = [s.busy[0] for s in self.slots if s.busy is not None]
            done, _ = ray.wait(refs, num_returns=1, timeout=min(self.timeout_s, 5.0))
            if not done and time.monotonic() > deadline:
                raise CadenzaError(f"rollout units did not finish within {self.timeout_s:g} s each")
            for i, slot in enumerate(self.slots):
                if slot.busy is None or slot.busy[0] not in done:
                    continue
                ref, pos, tries = slot.busy
                slot.busy = None
                try:
                    results[pos] = ray.get(ref)
                except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError):
                    self.counts.restarts += 1
                    self.slots[i] = self._new_slot()
                    if tries < self.max_retries:
                        self.counts.retried += 1
                        todo.insert(0, (pos, tries + 1))
                    else:
                        self.counts.lost += 1
        return results

    def close(self) -> None:
        self._ex.close()
