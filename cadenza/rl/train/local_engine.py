"""The trainer's local ``hf`` engines and the one place the trainer obtains an engine.

Both implement :class:`cadenza.rl.engines.engine.RolloutEngine` over an :class:`HFPolicy`.
:class:`cadenza.rl.engines.hf.HFEngine` samples in this process (the trainer's own module when
training is synchronous, else its own copy). :class:`ProcessHFEngine` samples in a
child process from a shared-memory copy, so generation really runs beside training instead of
competing for the GIL; the sampling generator's state travels with each request, so its draws are
exactly the in-process ones.

``vllm`` and ``openai`` come from :func:`cadenza.rl.engines.make_engine` (the engine package); with
``rollout.engine_placement = "ray"`` each ``vllm`` server runs in a Ray actor on any node with
``rollout.engine_resources`` (:mod:`cadenza.rl.engines.ray_engine`), joined to the rollout actors'
cluster (``executor = "ray"``) or to a cluster of their own behind this process's router (``local``).
"""

from __future__ import annotations

import contextlib
import copy
import shutil
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.multiprocessing as mp

from cadenza.errors import ConfigError, EngineError
from cadenza.rl.engines.hf import HFEngine, WeightTable
from cadenza.rl.engines.policy import HFPolicy, Sample, SampleRequest
from cadenza.rl.engines.ray_engine import RayEngine, RayEnginePlacement, start_ray_engines

if TYPE_CHECKING:
    from cadenza.rl.config import TrainConfig


def _serve(conn: Any, model: torch.nn.Module, device: str, threads: int) -> None:
    """The child process of :class:`ProcessHFEngine`: answer sample requests until told to stop."""
    torch.set_num_threads(threads)
    policy = HFPolicy(model, device=device)
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg[0] == "stop":
            return
        _, request, state = msg
        gen = torch.Generator()
        if state is not None:
            gen.set_state(state)
        try:
            out = policy.sample(replace(request, generator=gen))  # its seeds and token limits kept
        except Exception as exc:  # sent back as one line; the parent raises it
            conn.send(("error", f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"))
            continue
        conn.send(("ok", out, gen.get_state() if state is not None else None))


class ProcessHFEngine:
    """HF sampling in a child process over a shared-memory copy of the weights (rollouts beside training).

    ``sync_weights`` writes the shared tensors from this process; the rollout pipeline never syncs while
    a request is in flight. Every request waits at most ``timeout_s``; a dead child is one clear error.
    """

    name = "hf"
    fixed_batches = True  # an HF forward's numerics move with the batch (HFPolicy.fixed_batches)

    def __init__(self, policy: HFPolicy, *, version: int = 0, timeout_s: float = 600.0) -> None:
        if policy.device.type != "cpu":
            raise ConfigError("the subprocess hf engine shares CPU memory; on a GPU use engine = 'vllm'")
        model = copy.deepcopy(policy.model)
        model.requires_grad_(False)
        model.share_memory()
        self._table = WeightTable(model)
        self._version = int(version)
        self.timeout_s = timeout_s
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve, args=(child, model, str(policy.device), torch.get_num_threads()), daemon=True
        )
        self._proc.start()
        child.close()

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    @property
    def version(self) -> int:
        return self._version

    def _dead(self) -> EngineError:
        self._proc.join(1.0)
        return EngineError(
            f"engine 'hf' process (pid {self._proc.pid}) exited with code {self._proc.exitcode}"
        )

    def sample(self, request: SampleRequest) -> list[Sample]:
        generator = request.generator
        state = generator.get_state() if generator is not None else None
        try:
            plain = replace(request, prompts=[list(p) for p in request.prompts], generator=None)
            self._conn.send(("sample", plain, state))
            deadline = time.monotonic() + self.timeout_s
            while not self._conn.poll(0.2):
                if not self._proc.is_alive():
                    raise self._dead()
                if time.monotonic() > deadline:
                    raise EngineError(
                        f"engine 'hf' (pid {self._proc.pid}) did not answer within {self.timeout_s:g} s"
                    )
            reply = self._conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError):
            raise self._dead() from None
        if reply[0] == "error":
            raise EngineError(f"engine 'hf' failed to sample: {reply[1]}")
        _, out, new_state = reply
        if generator is not None:
            generator.set_state(new_state)
        for s in out:
            s.policy_version = self._version
        return out

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], *, version: int) -> None:
        if not self._proc.is_alive():
            raise self._dead()
        self._table.load(named_tensors)
        self._version = int(version)

    def close(self) -> None:
        if self._proc.is_alive():
            with contextlib.suppress(BrokenPipeError, OSError):
                self._conn.send(("stop",))
            self._proc.join(2.0)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(2.0)
        self._conn.close()


def build_engine(cfg: TrainConfig, policy: HFPolicy, tokenizer: Any, *, version: int) -> Any:
    """The engine named by ``[rollout] engine`` (a :class:`RolloutEngine`), at ``version``.

    ``hf`` shares the trainer's module when training is synchronous (``max_staleness = 0``: the old
    loop, bit for bit) and samples in a child process otherwise (on CPU; in-process copy on GPUs).
    ``vllm`` is built by ``cadenza.rl.engines.make_engine`` (which starts the server) and brought to the
    trainer's weights by the caller's first sync. (``openai`` cannot take weights: config rejects it.)
    """
    r = cfg.rollout
    if r.executor == "ray":  # the actors run the episodes; weights reach them through sync_weights
        from cadenza.executor import ExecutorConfig
        from cadenza.rl.train.ray_workers import RayWorkers

        ex = ExecutorConfig(kind="ray", ray_address=r.ray_address, workers=r.workers, run_dir=None)
        if r.engine == "hf":  # each actor holds its own copy; weights go through the object store
            return RayWorkers(cfg, r.workers, ex, timeout_s=r.engine_timeout_s)
        if r.engine_placement == "ray":  # engine actors on the same cluster, started once it is up
            if not r.ray_address:  # a private cluster: a CPU per engine actor besides the rollout actors
                ex = replace(ex, workers=r.workers + r.engines)
            return RayWorkers(
                cfg, r.workers, ex, timeout_s=r.engine_timeout_s, tokenizer=tokenizer,
                engines=lambda: ray_engines(cfg, policy, tokenizer),
            )  # fmt: skip
        engines = served_engines(cfg, policy, tokenizer, version=version)
        return RayWorkers(
            cfg, r.workers, ex, timeout_s=r.engine_timeout_s, engines=engines, tokenizer=tokenizer
        )
    if r.engine == "hf":
        if r.max_staleness == 0:
            return HFEngine(policy, share=True, version=version)
        if policy.device.type == "cpu":
            return ProcessHFEngine(policy, version=version, timeout_s=r.engine_timeout_s)
        return HFEngine(policy, share=False, version=version)
    if r.engine_placement == "ray":
        return EnginesOnRay(cfg, policy, tokenizer)
    engines = served_engines(cfg, policy, tokenizer, version=version)
    if len(engines) == 1:
        return engines[0]
    from cadenza.rl.rollout.router import Router

    return Router(engines)


def served_engines(cfg: TrainConfig, policy: HFPolicy, tokenizer: Any, *, version: int) -> list[Any]:
    """Start ``rollout.engines`` vLLM servers (one at a time; all stopped again if one fails).

    A server loads ``model.path`` (or the initial weights written beside the run), i.e. version 0,
    whatever ``version`` the trainer is at: labelling it with a resumed checkpoint's version would skip
    the first sync and sample the first steps from the initial policy. The caller's first sync (any
    ``version > 0``) brings it to the trainer's weights."""
    del version  # the weights on disk are always the initial ones
    from cadenza.rl.engines import make_engine

    engines: list[Any] = []
    try:
        for options in engine_options(cfg, policy, tokenizer):
            engines.append(make_engine("vllm", **options))
    except BaseException:
        for e in engines:
            e.close()
        raise
    return engines


def engine_options(cfg: TrainConfig, policy: HFPolicy, tokenizer: Any) -> list[dict[str, Any]]:
    """``make_engine("vllm", **options)`` for each of ``rollout.engines`` servers, at version 0."""
    r = cfg.rollout
    out = Path(cfg.run.out_dir)
    model = cfg.model.path or str(save_initial(policy, tokenizer, out / "engine-model"))
    found = []
    for i in range(r.engines):
        options = dict(r.engine_options)  # vllm: VLLMServerConfig / VLLMEngineConfig fields
        options.setdefault("request_timeout_s", r.engine_timeout_s)
        options.setdefault("sync_timeout_s", r.engine_timeout_s)
        # named in every engine error
        options.setdefault("log_path", str(out / ("engine.log" if i == 0 else f"engine-{i}.log")))
        found.append({"model": model, "version": 0, **options})
    return found


def save_initial(policy: HFPolicy, tokenizer: Any, path: Path) -> Path:
    """A randomly initialised policy has no directory a served engine could load: write one (atomically;
    the first sync brings the engine to the trainer's weights anyway)."""
    if (path / "config.json").is_file():
        return path
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    policy.model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    tmp.rename(path)
    return path


# ---------------------------------------------- engine_placement = "ray": engines as Ray actors


def placement(cfg: TrainConfig) -> RayEnginePlacement:
    """Resources and timeouts of the engine actors, from ``[rollout]``."""
    r = cfg.rollout
    return RayEnginePlacement(
        resources={k: float(v) for k, v in r.engine_resources.items()},
        call_timeout_s=r.engine_timeout_s,
        startup_timeout_s=float(r.engine_options.get("startup_timeout_s", 300.0)) + 120.0,  # + placement
        bucket_bytes=int(r.engine_options.get("bucket_bytes", RayEnginePlacement.bucket_bytes)),
    )


def ray_engines(cfg: TrainConfig, policy: HFPolicy, tokenizer: Any) -> list[RayEngine]:
    """``rollout.engines`` engine actors on the cluster this process is connected to.

    The model directory must be readable at the same path on the engine's node (a shared filesystem);
    ``rollout.engine_options`` apply as for local servers (the log file is written on the engine's node).
    """
    return start_ray_engines(engine_options(cfg, policy, tokenizer), placement(cfg))


class EnginesOnRay:
    """``executor = "local"``: the engines on a Ray cluster, the router in this process; closing it stops
    the engines and then this process's Ray connection (or its private cluster)."""

    name = "vllm"

    def __init__(self, cfg: TrainConfig, policy: HFPolicy, tokenizer: Any) -> None:
        from cadenza.executor import ExecutorConfig
        from cadenza.executor.ray import RayExecutor
        from cadenza.rl.rollout.router import Router

        r = cfg.rollout
        # a private cluster gets one CPU per engine (their default resource) and one to spare
        self._ex = RayExecutor(ExecutorConfig(kind="ray", ray_address=r.ray_address, workers=r.engines + 1))
        try:
            self.engines = ray_engines(cfg, policy, tokenizer)
        except BaseException:
            self._ex.close()
            raise
        self._one = self.engines[0] if len(self.engines) == 1 else Router(self.engines)

    @property
    def version(self) -> int:
        return int(self._one.version)

    @property
    def log_path(self) -> str:
        return "; ".join(e.log_path for e in self.engines)

    def sample(self, request: SampleRequest) -> list[Sample]:
        return self._one.sample(request)

    def score(self, sequences: Any) -> list[list[float]]:
        return self.engines[0].score(sequences)

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], *, version: int) -> None:
        self._one.sync_weights(named_tensors, version=version)

    def close(self) -> None:
        try:
            self._one.close()
        finally:
            self._ex.close()
