"""vLLM engines as Ray actors, placed by resources on any node of a cluster (``rollout.engine_placement``).

Each :class:`EngineActor` owns one :class:`~cadenza.rl.engines.vllm.VLLMEngine`: the same supervised
server process as a local engine, started on the actor's node and listening on that node's loopback
only (the dev-mode RPC endpoint must never face the network). Nobody else talks HTTP to it: the driver
and the rollout actors reach it through Ray calls on the actor (:class:`RayEngine`, a client with the
:class:`~cadenza.rl.engines.engine.RolloutEngine` face), which then sample and score over the engine's
OpenAI-compatible API on its own node. So an engine on another machine needs no open port of its own.

Weight syncs cross nodes as safetensors bytes (``/dev/shm`` files do not): the driver streams the
tensors in size-bounded buckets, each one actor call, and the actor feeds them to its engine's own sync
through a bounded queue, so neither side holds the whole model. Both hops are counted: the driver
compares the names it sent with the names the actor passed on, and the engine compares those with what
its worker read (:func:`~cadenza.rl.engines.sync_check.check_received`). Every Ray call has a timeout.
``close`` stops the server (its process group and ``/dev/shm`` segments) before the actor is killed; an
actor that dies without it takes the server with it (the server's supervisor follows its parent).
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from cadenza.errors import CadenzaError, EngineError
from cadenza.rl.engines.openai import request_seeds
from cadenza.rl.engines.policy import Sample, SampleRequest
from cadenza.rl.engines.sync_check import check_received
from cadenza.rl.engines.weights import buckets, engine_names, to_safetensors_bytes

_END = None  # end of a sync's bucket stream
_ABORT = "abort"  # the driver gave up mid-stream: the engine must not reload a partial set


@dataclass(kw_only=True)
class RayEnginePlacement:
    """Where engine actors go and how long their calls may take."""

    # Ray resources each engine actor takes ({"GPU": 1}, {"engine": 1}, ...); {} = one GPU where the
    # cluster has GPUs, else one CPU
    resources: dict[str, float] = field(default_factory=dict)
    call_timeout_s: float = 600.0  # any one call on the actor (a generation, a score, one sync bucket)
    startup_timeout_s: float = 600.0  # the actor placed and its server healthy
    bucket_bytes: int = 64 << 20  # at most this many tensor bytes per sync call (through the object store)
    max_concurrency: int = 32  # calls the actor serves at once (generations from many rollout actors)


def ray_options(resources: dict[str, float], nodes: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``.options()`` for one engine actor, or a one-line error when no alive node offers ``resources``
    (Ray would leave the actor pending forever)."""
    alive = [n for n in nodes if n.get("Alive")]
    want = dict(resources) or (
        {"GPU": 1.0} if any(n.get("Resources", {}).get("GPU", 0) for n in alive) else {"CPU": 1.0}
    )
    if any(v < 0 for v in want.values()):
        raise CadenzaError(f"rollout.engine_resources {want} has a negative amount; use amounts >= 0")
    if not any(all(n.get("Resources", {}).get(k, 0) >= v for k, v in want.items()) for n in alive):
        offered = "; ".join(
            ", ".join(f"{k}={v:g}" for k, v in sorted(n.get("Resources", {}).items()) if "node:" not in k)
            for n in alive
        )
        raise CadenzaError(
            f"rollout.engine_resources {want} fits no node of the Ray cluster (nodes offer: {offered}); "
            "start a node with those resources (ray start --resources ...) or change engine_resources"
        )
    custom = {k: v for k, v in want.items() if k not in ("CPU", "GPU")}
    return {"num_cpus": want.get("CPU", 0), "num_gpus": want.get("GPU", 0), "resources": custom}


class EngineActor:
    """The body of an engine actor: one vLLM server on this node, its sync stream, its shutdown."""

    def __init__(self, options: dict[str, Any]) -> None:
        self._options = dict(options)
        self._engine: Any = None
        self._sync: dict[str, Any] | None = None

    def start(self) -> dict[str, Any]:
        """Start the server (on this node's loopback); where it runs, for the driver."""
        import ray

        from cadenza.rl.engines import make_engine

        try:
            self._engine = make_engine("vllm", **self._options)
        except CadenzaError as exc:  # one line naming the node: a model path missing there, a bad port
            raise CadenzaError(f"on Ray node {socket.gethostname()}: {exc}") from None
        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "base_url": self._engine.server.base_url,
            "server_pid": self._engine.server.proc.pid,
            "log_path": str(self._engine.log_path),
            "version": self._engine.version,
        }

    def sample(self, request: SampleRequest) -> list[Sample]:
        return self._engine.sample(request)

    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        return self._engine.score(sequences)

    def version(self) -> int:
        return int(self._engine.version)

    def sync_begin(self, version: int, timeout_s: float) -> None:
        """Start the engine's own sync on a thread, fed by :meth:`sync_bucket` through a bounded queue."""
        if self._sync is not None and self._sync["thread"].is_alive():
            raise EngineError("engine actor: a weight sync is already running")
        q: queue.Queue[Any] = queue.Queue(maxsize=2)
        state: dict[str, Any] = {"q": q, "names": [], "error": None, "timeout": timeout_s}

        def stream() -> Iterator[tuple[str, torch.Tensor]]:
            while (item := q.get(timeout=timeout_s)) is not _END:
                if item is _ABORT:
                    raise EngineError("the driver aborted the weight sync; the engine kept its weights")
                for name, t in item.items():
                    state["names"].append(name)
                    yield name, t

        def run() -> None:
            try:
                self._engine.sync_weights(stream(), version=version)
            except BaseException as exc:  # reported by the next sync_bucket / sync_end
                state["error"] = exc

        state["thread"] = threading.Thread(target=run, name="cadenza-engine-sync", daemon=True)
        self._sync = state
        state["thread"].start()

    def _failed(self) -> None:
        s = self._sync
        if s is None:
            raise EngineError("engine actor: no weight sync in progress")
        if s["error"] is not None:
            exc = s["error"]
            raise exc if isinstance(exc, CadenzaError) else EngineError(f"{type(exc).__name__}: {exc}")

    def sync_bucket(self, data: bytes) -> int:
        """One bucket (safetensors bytes); waits while the engine is behind (bounded queue)."""
        from safetensors.torch import load

        self._failed()
        tensors = load(data)
        deadline = time.monotonic() + self._sync["timeout"]
        while True:
            try:
                self._sync["q"].put(tensors, timeout=0.2)
                return len(tensors)
            except queue.Full:
                self._failed()
                if time.monotonic() > deadline:
                    raise EngineError("engine actor: the engine took no weights within the timeout") from None

    def sync_end(self) -> dict[str, Any]:
        """Wait for the engine's sync; the names it was given (the driver checks them against its own)."""
        s = self._sync
        self._failed()
        try:
            s["q"].put(_END, timeout=s["timeout"])
        except queue.Full:
            self._failed()
            raise EngineError("engine actor: the engine took no weights for the sync timeout") from None
        s["thread"].join(s["timeout"])
        if s["thread"].is_alive():
            raise EngineError(f"engine actor: the weight sync did not finish within {s['timeout']:g} s")
        self._failed()
        self._sync = None
        return {"names": s["names"], "tensors": len(s["names"]), "version": int(self._engine.version)}

    def sync_abort(self) -> None:
        """The driver failed mid-stream: the engine's sync raises before it reloads anything."""
        s = self._sync
        if s is not None and s["thread"].is_alive():
            with contextlib.suppress(queue.Full):
                s["q"].put(_ABORT, timeout=s["timeout"])
            s["thread"].join(s["timeout"])
        self._sync = None

    def close(self) -> bool:
        """Stop the server: its whole process group, and the ``/dev/shm`` segments it had mapped."""
        if self._engine is not None:
            self._engine.close()
            self._engine = None
        return True


class RayEngine:
    """A client of one :class:`EngineActor`: the :class:`RolloutEngine` face the router, the trainer and
    the rollout actors use. ``own``: this client started the actor and stops it on :meth:`close`."""

    name = "vllm"
    supports_sync = True

    def __init__(
        self, actor: Any, info: dict[str, Any], placement: RayEnginePlacement, *, own: bool = False
    ) -> None:
        self.actor, self.info, self.placement, self.own = actor, dict(info), placement, own
        self._version = int(info.get("version", 0))
        self._closed = False

    @property
    def version(self) -> int:
        return self._version

    @property
    def node_id(self) -> str:
        return str(self.info["node_id"])

    @property
    def base_url(self) -> str:
        """The server's URL on its own node's loopback (reachable from that node only)."""
        return str(self.info["base_url"])

    @property
    def log_path(self) -> str:
        return f"{self.info.get('log_path')} on {self.info.get('host')}"

    def handle(self) -> tuple[Any, dict[str, Any]]:
        """What a rollout actor needs to reach this engine (a Ray actor handle travels between actors)."""
        return self.actor, {**self.info, "version": self._version}

    def at_version(self, version: int) -> None:
        """The driver synced the engine to ``version`` (a rollout actor's client is told)."""
        self._version = int(version)

    def _get(self, ref: Any, what: str, timeout_s: float | None = None) -> Any:
        import ray

        timeout = self.placement.call_timeout_s if timeout_s is None else timeout_s
        try:
            return ray.get(ref, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise EngineError(
                f"engine actor on {self.info.get('host')} did not answer a {what} within {timeout:g} s "
                f"(log: {self.log_path})"
            ) from None
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, CadenzaError):  # ContextLengthExceeded and EngineError keep their class
                raise cause from None
            raise
        except ray.exceptions.RayActorError as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise EngineError(
                f"engine actor on {self.info.get('host')} died during a {what} ({first[:200]}); "
                f"log: {self.log_path}"
            ) from None

    def sample(self, request: SampleRequest) -> list[Sample]:
        plain = replace(
            request, prompts=[list(p) for p in request.prompts], generator=None, seeds=request_seeds(request)
        )
        return self._get(self.actor.sample.remote(plain), "generation")

    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        return self._get(self.actor.score.remote([list(s) for s in sequences]), "scoring")

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], *, version: int) -> None:
        """Stream bucket by bucket to the actor, then check that it passed on every tensor sent."""
        t = self.placement.call_timeout_s
        self._get(self.actor.sync_begin.remote(int(version), t), "weight sync start")
        sent: list[str] = []
        ok = False
        try:
            for bucket in buckets(engine_names(named_tensors), bucket_bytes=self.placement.bucket_bytes):
                sent += [name for name, _ in bucket]
                self._get(self.actor.sync_bucket.remote(to_safetensors_bytes(bucket)), "weight sync bucket")
            ok = True
        finally:
            if not ok:  # the actor's engine must not reload a partial set (nor wait out its timeout)
                with contextlib.suppress(Exception):
                    self._get(self.actor.sync_abort.remote(), "weight sync abort", timeout_s=min(t, 30.0))
        result = self._get(self.actor.sync_end.remote(), "weight sync end")
        check_received(sent, result)
        self._version = int(result["version"])

    def close(self) -> None:
        """Stop the server in the actor (no ``/dev/shm`` left), then the actor; idempotent."""
        if self._closed or not self.own:
            self._closed = True
            return
        self._closed = True
        import ray

        with contextlib.suppress(Exception):
            self._get(self.actor.close.remote(), "shutdown", timeout_s=min(self.placement.call_timeout_s, 60))
        with contextlib.suppress(Exception):
            ray.kill(self.actor, no_restart=True)


def start_ray_engines(options: Sequence[dict[str, Any]], placement: RayEnginePlacement) -> list[RayEngine]:
    """One engine actor per entry of ``options`` (``make_engine("vllm", **options)`` fields), placed by
    ``placement.resources``, all started at once; all stopped again if one fails. Ray must be initialised."""
    import ray

    opts = ray_options(placement.resources, ray.nodes())
    cls = ray.remote(EngineActor).options(**opts, max_restarts=0, max_concurrency=placement.max_concurrency)
    actors = [cls.remote(dict(o)) for o in options]
    engines: list[RayEngine] = []
    try:
        refs = [a.start.remote() for a in actors]
        deadline = time.monotonic() + placement.startup_timeout_s
        for actor, ref in zip(actors, refs, strict=True):
            starting = RayEngine(actor, {"host": "its node", "log_path": "engine log"}, placement, own=True)
            info = starting._get(ref, "start-up", timeout_s=max(1.0, deadline - time.monotonic()))
            engines.append(RayEngine(actor, info, placement, own=True))
    except BaseException:
        for e in engines:
            e.close()
        for a in actors[len(engines) :]:
            RayEngine(a, {}, placement, own=True).close()
        raise
    return engines


def connect_actors(
    handles: Sequence[tuple[Any, dict[str, Any]]], *, version: int, timeout_s: float
) -> list[RayEngine]:
    """Clients of engine actors another process started (a rollout actor's), each checked to answer."""
    clients = [RayEngine(a, info, RayEnginePlacement(call_timeout_s=timeout_s)) for a, info in handles]
    for c in clients:
        c._get(c.actor.version.remote(), "health check", timeout_s=min(timeout_s, 60.0))
        c.at_version(version)
    return clients
