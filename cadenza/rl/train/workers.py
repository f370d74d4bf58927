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

import os
import socket
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from cadenza.errors import CadenzaError, EngineError
from cadenza.executor import ExecutorConfig
from cadenza.rl.rollout.episodes import TrainEpisode, collect_episodes, step_seed


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


@dataclass(kw_only=True)
class Endpoints:
    """The served engines a worker samples from (``vllm`` started by the trainer, or ``openai``)."""

    urls: list[str]  # base URLs (without /v1), reachable from every worker node
    version: int = 0  # policy version the engines hold now (the driver updates it after each sync)
    timeout_s: float = 600.0  # one generation request
    tokenizer: Any = None  # the trainer's tokenizer (workers then load no model at all)


class RolloutWorker:
    """What one worker holds: env source, tokenizer, monitor, engine. Also the body of a Ray actor.

    With ``endpoints`` the engine is a :class:`~cadenza.rl.rollout.router.Router` over HTTP clients of the
    served engines (least-loaded placement, session affinity per episode); :meth:`connect` reaches them."""

    def __init__(self, cfg: Any, endpoints: Endpoints | None = None, *, threads: int = 1) -> None:
        from cadenza.rl.rollout.envs import load_source

        torch.set_num_threads(threads)
        self.cfg = cfg
        self.endpoints = endpoints
        self.source = load_source(cfg.env.name, cfg.env.options)
        self.engine: Any = None
        if cfg.rollout.engine == "hf":
            from cadenza.rl.engines.hf import HFEngine
            from cadenza.rl.train.build import build_policy

            self.tokenizer, policy = build_policy(cfg)
            self.engine = HFEngine(policy, share=True)
        elif endpoints is None or not endpoints.urls:
            raise CadenzaError(
                f"rollout workers with engine {cfg.rollout.engine!r} need served engine endpoints"
            )
        else:
            from cadenza.rl.text.chat import load_tokenizer

            self.tokenizer = endpoints.tokenizer or load_tokenizer(cfg.model.tokenizer or cfg.model.path)

    def connect(self) -> str | None:
        """Reach every served engine; one line naming the first that does not answer (``None``: all do)."""
        if self.endpoints is None or self.engine is not None:
            return None
        from cadenza.rl.engines.openai import OpenAIEngine, OpenAIEngineConfig
        from cadenza.rl.rollout.router import Router

        e = self.endpoints
        try:  # OpenAIEngine asks /v1/models for the served name: a health check with a timeout
            clients = [
                OpenAIEngine(OpenAIEngineConfig(base_url=u, timeout_s=e.timeout_s), version=e.version)
                for u in e.urls
            ]
        except CadenzaError as exc:
            return (
                f"rollout worker on {socket.gethostname()} (pid {os.getpid()}) cannot reach its engine: {exc}"
            )
        self.engine = Router(clients)
        return None

    def sync(self, state: dict[str, torch.Tensor], version: int) -> int:
        self.engine.sync_weights(state.items(), version=version)
        return version

    def at_version(self, version: int) -> int:
        """The trainer synced the served engines to ``version`` (their samples are tagged with it)."""
        assert self.endpoints is not None
        self.endpoints.version = version
        for client in getattr(self.engine, "engines", ()):
            client.at_version(version)
        return version

    def run(self, unit: Unit) -> list[TrainEpisode]:
        problem = self.connect()
        if problem is not None:
            raise EngineError(problem)
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
        return os.getpid()


class Served:
    """The driver's side of the served engines: it owns them (or not), syncs them in one pass, and tells
    the workers which version they hold."""

    def __init__(self, engines: Sequence[Any], *, own: bool, timeout_s: float, tokenizer: Any) -> None:
        from cadenza.rl.rollout.router import Router

        self.engines, self.own = list(engines), own
        self._sync = self.engines[0] if len(self.engines) == 1 else Router(self.engines)
        self.spec = Endpoints(
            urls=[e.client.base_url for e in self.engines],
            version=self.version,
            timeout_s=timeout_s,
            tokenizer=tokenizer,
        )

    @property
    def version(self) -> int:
        return min(int(e.version) for e in self.engines)

    def sync(self, named: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        self._sync.sync_weights(named, version=version)
        self.spec.version = version

    def close(self) -> None:
        if self.own:
            for e in self.engines:
                e.close()


def _state(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in named}


class LocalWorkers:
    """Units run one after the other in this process (the reference for :class:`RayWorkers`)."""

    name = "local"

    def __init__(
        self, cfg: Any, *, engines: Sequence[Any] = (), own_engines: bool = False, tokenizer: Any = None
    ) -> None:
        timeout = cfg.rollout.engine_timeout_s
        self.served = (
            Served(engines, own=own_engines, timeout_s=timeout, tokenizer=tokenizer) if engines else None
        )
        self.worker = RolloutWorker(
            cfg, self.served.spec if self.served else None, threads=torch.get_num_threads()
        )
        problem = self.worker.connect()
        if problem is not None:
            raise CadenzaError(problem)
        self.counts = WorkerCounts()

    def sync(self, named: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        if self.served is not None:
            self.served.sync(named, version)
            self.worker.at_version(version)
        else:
            self.worker.sync(_state(named), version)

    def run(self, units: list[Unit]) -> list[list[TrainEpisode] | None]:
        self.counts.units += len(units)
        return [self.worker.run(u) for u in units]

    def close(self) -> None:
        if self.served is not None:
            self.served.close()


@dataclass(kw_only=True)
class _Slot:
    actor: Any
    busy: Any = None  # (ref, position, tries) while a unit runs


class RayWorkers:
    """``n`` Ray actors pulling units; the bounded in-flight window is one unit per actor.

    With ``engines`` (served engines this driver started and syncs) the actors hold no weights: each
    reaches the engines through its own router, health-checked at start (one line, before any work)."""

    name = "ray"

    def __init__(
        self,
        cfg: Any,
        n: int,
        executor: ExecutorConfig,
        *,
        timeout_s: float = 600.0,
        engines: Sequence[Any] = (),
        own_engines: bool = True,
        tokenizer: Any = None,
    ) -> None:
        from cadenza.executor.ray import RayExecutor

        if n < 1:
            raise CadenzaError(f"rollout workers must be >= 1, got {n}")
        self.cfg, self.timeout_s, self.max_retries = cfg, timeout_s, executor.max_retries
        self.counts = WorkerCounts()
        self.served = (
            Served(engines, own=own_engines, timeout_s=timeout_s, tokenizer=tokenizer) if engines else None
        )
        self._weights: tuple[Any, int] | None = None
        try:
            self._ex = RayExecutor(executor)
        except BaseException:
            self.close_engines()
            raise
        try:
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
        return self._get([s.actor.pid.remote() for s in self.slots], "pid query")

    def sync(self, named: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Served engines: sync them in place, then tell the actors the version. Otherwise put the
        weights in the object store once; every actor loads them (one copy per node)."""
        import ray

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

        results: list[list[TrainEpisode] | None] = [None] * len(units)
        todo = [(pos, 0) for pos in range(len(units))]  # (position, tries so far)
        self.counts.units += len(units)
        deadline = time.monotonic() + self.timeout_s * max(1, len(units))
        try:
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

    def close_engines(self) -> None:
        if self.served is not None:
            self.served.close()

    def close(self) -> None:
        try:
            self._ex.close()
        finally:
            self.close_engines()
