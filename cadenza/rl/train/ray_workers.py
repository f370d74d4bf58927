"""Ray rollout actors pulling units (:mod:`cadenza.rl.train.workers` holds the unit, the worker body and
the in-process reference).

The driver makes one routing decision over every actor's load (each unit's new sessions go to the
least-loaded served engine), and every unit has its own deadline (``rollout.unit_timeout_s``): a unit
past it has its actor killed and is re-run, up to the executor's retries.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from cadenza.errors import CadenzaError, EngineError
from cadenza.executor import ExecutorConfig
from cadenza.rl.rollout.episodes import TrainEpisode
from cadenza.rl.train.workers import RolloutWorker, Served, Unit, WorkerCounts, _state

if TYPE_CHECKING:
    from cadenza.rl.config import TrainConfig


@dataclass(kw_only=True)
class _Slot:
    actor: Any
    busy: Any = None  # (ref, position, tries) while a unit runs
    since: float = 0.0  # when its unit started (the unit's own deadline counts from here)
    engine: int | None = None  # the served engine its unit's sessions go to
    dead: bool = False  # its actor was killed and is replaced only when the workers are used again


def least_loaded(load: Sequence[int], turn: int) -> int:
    """The engine with the fewest units in flight; ties go round-robin from ``turn`` (never always to
    engine 0, which is what one router per actor did: every actor saw the same idle engines)."""
    n = len(load)
    return min(range(n), key=lambda i: (load[i], (i - turn) % n))


class RayWorkers:
    """``n`` Ray actors pulling units; the bounded in-flight window is one unit per actor.

    With ``engines`` (served engines this driver started and syncs) the actors hold no weights: each
    reaches the engines through its own router, health-checked at start (one line, before any work)."""

    name = "ray"

    def __init__(
        self,
        cfg: TrainConfig,
        n: int,
        executor: ExecutorConfig,
        *,
        timeout_s: float = 600.0,
        engines: Sequence[Any] | Callable[[], Sequence[Any]] = (),
        own_engines: bool = True,
        tokenizer: Any = None,
    ) -> None:
        from cadenza.executor.ray import RayExecutor

        if n < 1:
            raise CadenzaError(f"rollout workers must be >= 1, got {n}")
        self.cfg, self.timeout_s, self.max_retries = cfg, timeout_s, executor.max_retries
        self.unit_timeout_s = float(getattr(cfg.rollout, "unit_timeout_s", 1800.0))
        self._turn = 0  # round-robin start for ties between equally loaded engines
        self.counts = WorkerCounts()
        start = engines if callable(engines) else None  # engine actors: started once Ray is up
        self.served = (
            Served(engines, own=own_engines, timeout_s=timeout_s, tokenizer=tokenizer)
            if engines and start is None
            else None
        )
        self._weights: tuple[Any, int] | None = None
        try:
            self._ex = RayExecutor(executor)
        except BaseException:
            self.close_engines()
            raise
        try:
            if start is not None:
                self.served = Served(start(), own=True, timeout_s=timeout_s, tokenizer=tokenizer)
            self.slots = [self._new_slot(check=False) for _ in range(n)]
            self._get([s.actor.pid.remote() for s in self.slots], "start")
            self._check([s.actor for s in self.slots])
        except BaseException:
            self.close()
            raise

    def _new_slot(self, *, check: bool = True) -> _Slot:
        spec = self.served.spec if self.served else None
        actor = self._ex.actor(RolloutWorker, self.cfg, spec, num_cpus=1)
        if check:
            self._check([actor])
        if self._weights is not None:
            ref, version = self._weights
            self._get([actor.sync.remote(ref, version)], f"weight push to version {version}")
        return _Slot(actor=actor)

    def _check(self, actors: list[Any]) -> None:
        """Every actor reaches every served engine, or one line names the first that cannot."""
        if self.served is None:
            return
        problems = [p for p in self._get([a.connect.remote() for a in actors], "engine health check") if p]
        if problems:
            raise CadenzaError(problems[0])

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
        if self.served is not None:
            return self.served.version
        return -1 if self._weights is None else self._weights[1]

    def sync_weights(self, named: Iterable[tuple[str, torch.Tensor]], *, version: int) -> None:
        self.sync(named, version)

    def sample(self, *args: Any, **kwargs: Any) -> Any:
        raise CadenzaError("Ray rollout workers sample inside their actors; call run(units)")

    def pids(self) -> list[int]:
        self._revive()
        return self._get([s.actor.pid.remote() for s in self.slots], "pid query")

    def _revive(self) -> None:
        """Replace the actors killed by a run that then stopped (not before: a stopping run would wait
        for an actor start it never uses)."""
        for i, slot in enumerate(self.slots):
            if slot.dead:
                self.counts.restarts += 1
                self.slots[i] = self._new_slot()

    def sync(self, named: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Served engines: sync them in place, then tell the actors the version. Otherwise put the
        weights in the object store once; every actor loads them (one copy per node)."""
        import ray

        self._revive()
        if self.served is not None:
            self.served.sync(named, version)
            self._get([s.actor.at_version.remote(version) for s in self.slots], f"version {version} notice")
            return
        ref = ray.put(_state(named))
        self._weights = (ref, version)
        self._get(
            [s.actor.sync.remote(ref, version) for s in self.slots], f"weight push to version {version}"
        )

    def run(self, units: list[Unit]) -> list[list[TrainEpisode] | None]:
        """Every unit's episodes, in unit order (``None`` for a lost unit).

        A unit whose actor died is re-run on a fresh actor; one whose engine call failed
        (:class:`EngineError`, e.g. the engine went away) is re-run too, and past ``max_retries`` the
        run stops with one line naming the unit. Nothing of a failed unit is returned."""
        import ray

        self._revive()
        results: list[list[TrainEpisode] | None] = [None] * len(units)
        todo = [(pos, 0) for pos in range(len(units))]  # (position, tries so far)
        self.counts.units += len(units)
        n_engines = len(self.served.engines) if self.served is not None else 0
        try:
            while todo or any(s.busy for s in self.slots):
                for slot in self.slots:
                    if slot.busy is None and todo:
                        pos, tries = todo.pop(0)
                        unit = units[pos]
                        if n_engines > 1:  # one routing decision over every actor's load
                            load = [
                                sum(1 for s in self.slots if s.busy and s.engine == e)
                                for e in range(n_engines)
                            ]
                            slot.engine = least_loaded(load, self._turn)
                            self._turn += 1
                            unit = dataclasses.replace(unit, engine=slot.engine)
                        slot.busy, slot.since = (slot.actor.run.remote(unit), pos, tries), time.monotonic()
                refs = [s.busy[0] for s in self.slots if s.busy is not None]
                done, _ = ray.wait(refs, num_returns=1, timeout=min(self.unit_timeout_s, 1.0))
                self._expire(units, todo)
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
                    except ray.exceptions.RayTaskError as exc:
                        cause = getattr(exc, "cause", None) or exc
                        if isinstance(cause, EngineError) and tries < self.max_retries:
                            self.counts.retried += 1
                            todo.append((pos, tries + 1))
                            continue
                        if not isinstance(cause, CadenzaError):
                            raise  # a bug in the unit: keep its traceback
                        first = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
                        u = units[pos]
                        raise CadenzaError(
                            f"rollout unit (step {u.step}, task {u.index}) failed on {tries + 1} "
                            f"attempt(s), {self.counts.retried} unit retries so far: {first}"
                        ) from None
        except BaseException:
            for slot in self.slots:  # what is still running is abandoned, never half-returned
                slot.busy = None
            raise
        return results

    def _expire(self, units: list[Unit], todo: list[tuple[int, int]]) -> None:
        """A unit past its own deadline: its actor is killed and replaced, the unit re-run up to
        ``max_retries`` times, then the run stops with one line naming it."""
        import ray

        now = time.monotonic()
        for i, slot in enumerate(self.slots):
            if slot.busy is None or now - slot.since <= self.unit_timeout_s:
                continue
            _, pos, tries = slot.busy
            slot.busy = None
            ray.kill(slot.actor, no_restart=True)
            u = units[pos]
            if tries >= self.max_retries:  # the run stops: its replacement waits for the next use
                slot.dead = True
                raise CadenzaError(
                    f"rollout unit (step {u.step}, task {u.index}) did not finish within "
                    f"{self.unit_timeout_s:g} s (rollout.unit_timeout_s) on {tries + 1} attempt(s); "
                    "its actor was killed"
                )
            self.counts.restarts += 1
            self.slots[i] = self._new_slot()
            self.counts.retried += 1
            todo.insert(0, (pos, tries + 1))

    def close_engines(self) -> None:
        if self.served is not None:
            self.served.close()

    def close(self) -> None:
        if self.served is not None and self.served.spec.actors:  # engine actors: stopped while Ray is up
            try:
                self.close_engines()
            finally:
                self._ex.close()
            return
        try:
            self._ex.close()
        finally:
            self.close_engines()
