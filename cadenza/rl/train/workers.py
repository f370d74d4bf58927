"""Rollout workers: one (task, group) unit at a time, in this process or in Ray actors.

A unit is "step s, task i of that step". It is rolled out with its own generator, seeded from
``(seed, s, i)``, as its own batch, then graded, monitored and annotated with hints where it ran, so
its episodes are the same whether a :class:`LocalWorkers` or a
:class:`~cadenza.rl.train.ray_workers.RayWorkers` ran it. Each
Ray actor owns its environments (and their bubblewrap sandboxes) and an engine: its own ``hf``
copy, whose weights the driver pushes once per version through the object store, or a client of
the served engine(s) the trainer keeps in sync (``vllm``/``openai``).

Faults: an actor that dies mid-unit is replaced (and brought to the current weights) and the unit
is re-run elsewhere up to ``max_retries`` times; past that it is lost. Both are counted. Every wait
has a timeout: a weight push that does not finish in ``timeout_s`` stops the run with one line, and
a unit past ``rollout.unit_timeout_s`` has its actor killed and is re-run, then stops the run.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from cadenza.errors import CadenzaError, EngineError
from cadenza.rl.rollout.episodes import TrainEpisode, collect_episodes, step_seed

if TYPE_CHECKING:
    from cadenza.rl.config import TrainConfig


@dataclass(kw_only=True)
class Unit:
    step: int
    index: int  # position of the task in its step (its GRPO group id prefix)
    task: Any
    engine: int | None = None  # served engines: the one the driver chose for this unit's new sessions


def unit_seed(cfg: TrainConfig, step: int, index: int) -> int:
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
    # engines in Ray actors (engine_placement = "ray"): (actor handle, info) each, reached by Ray calls
    # instead of ``urls`` (their servers listen on their own node's loopback)
    actors: list[tuple[Any, dict[str, Any]]] = field(default_factory=list)


class RolloutWorker:
    """What one worker holds: env source, tokenizer, monitor, engine. Also the body of a Ray actor.

    With ``endpoints`` the engine is a :class:`~cadenza.rl.rollout.router.Router` over HTTP clients of the
    served engines (least-loaded placement, session affinity per episode); :meth:`connect` reaches them."""

    def __init__(self, cfg: TrainConfig, endpoints: Endpoints | None = None, *, threads: int = 1) -> None:
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
            if e.actors:
                from cadenza.rl.engines.ray_engine import connect_actors

                clients = connect_actors(e.actors, version=e.version, timeout_s=e.timeout_s)
            else:
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
        if hasattr(self.engine, "prefer"):
            self.engine.prefer = unit.engine
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
        handles = [e.handle() for e in self.engines if hasattr(e, "handle")]  # engines in Ray actors
        self.spec = Endpoints(
            urls=[e.base_url if handles else e.client.base_url for e in self.engines],
            actors=handles,
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
        self,
        cfg: TrainConfig,
        *,
        engines: Sequence[Any] = (),
        own_engines: bool = False,
        tokenizer: Any = None,
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
