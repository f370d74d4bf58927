"""The ``vllm`` engine: a vLLM server cadenza starts, samples from token-in/token-out, and syncs in place.

Sampling goes through the completions API (see :mod:`cadenza.rl.engines.openai`) with the server in
``processed_logprobs`` mode, so each log-prob is under the distribution actually sampled (temperature
and top-k applied). :meth:`VLLMEngine.sync_weights` streams the trainer's tensors in buckets of
safetensors (files under ``/dev/shm``, or base64 bytes), asks cadenza's worker extension to reload them
(one ``collective_rpc``), then drops the prefix cache; it waits for in-flight generation first, so
every :class:`Sample` is tagged with the version of the weights that really produced it.
On GPU machines :mod:`cadenza.rl.engines.gpu_sync` offers vLLM's native NCCL / CUDA-IPC transfer.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from cadenza.errors import CadenzaError, EngineError
from cadenza.rl.engines.openai import CompletionsClient, request_seeds
from cadenza.rl.engines.policy import Sample, SampleRequest
from cadenza.rl.engines.sync_check import check_received
from cadenza.rl.engines.vllm_server import VLLMServer, VLLMServerConfig
from cadenza.rl.engines.weights import DEFAULT_BUCKET_BYTES, buckets, engine_names, to_safetensors_bytes


@dataclass(kw_only=True)
class VLLMEngineConfig:
    """The served engine: its process, and how cadenza talks to it."""

    server: VLLMServerConfig  # model path, port, context window, KV cache size, log file
    request_timeout_s: float = 600.0  # one generation request (the whole completion)
    sync_timeout_s: float = 300.0  # one weight sync (all buckets, reload and cache reset)
    bucket_bytes: int = DEFAULT_BUCKET_BYTES  # at most this many bytes of tensors per staged bucket
    transport: str = (
        "file"  # "file" (safetensors under /dev/shm, one path per bucket) or "bytes" (base64 RPC)
    )
    max_concurrency: int = 64  # generation requests in flight at once
    weight_transfer: str = (
        "worker"  # "worker" (cadenza's extension, CPU and GPU) or vLLM's native "nccl"/"ipc" (GPU)
    )
    stage_dir: str | None = None  # where "file" buckets go; default /dev/shm (RAM), else the temp dir

    def __post_init__(self) -> None:
        if self.weight_transfer not in ("worker", "nccl", "ipc"):
            raise CadenzaError(
                f"vllm weight_transfer must be worker, nccl or ipc, got {self.weight_transfer!r}"
            )
        if self.transport not in ("file", "bytes"):
            raise CadenzaError(f"vllm transport must be 'file' or 'bytes', got {self.transport!r}")
        for name in ("request_timeout_s", "sync_timeout_s"):
            if getattr(self, name) <= 0:
                raise CadenzaError(f"vllm {name} must be > 0, got {getattr(self, name)}")


class VLLMEngine:
    """A running vLLM server behind the :class:`~cadenza.rl.engines.engine.RolloutEngine` protocol."""

    name = "vllm"
    supports_sync = True

    def __init__(self, config: VLLMEngineConfig, *, version: int = 0) -> None:
        self.config = config
        self.server = VLLMServer(config.server)
        self._version = version
        self._cond = threading.Condition()
        self._in_flight = 0
        self._syncing = False
        self._native = None
        if config.weight_transfer != "worker":
            from cadenza.rl.engines.gpu_sync import server_args

            config.server.extra_args = [*config.server.extra_args, *server_args(config.weight_transfer)]
            if config.weight_transfer == "ipc":  # IPC handles travel pickled over HTTP (loopback only)
                config.server.extra_env = {
                    **config.server.extra_env,
                    "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
                }
        self.server.start()
        self.client = CompletionsClient(
            self.server.base_url,
            model="cadenza",
            label="vllm",
            timeout_s=config.request_timeout_s,
            max_concurrency=config.max_concurrency,
            describe=self._describe,
        )

    @property
    def version(self) -> int:
        return self._version

    @property
    def log_path(self) -> Path | None:
        return self.server.log_path

    def _describe(self) -> str:
        if self.server.proc is None:
            return f"the engine is stopped (log: {self.server.log_path})"
        code = self.server.proc.poll()
        if code is not None:
            return f"the engine process died (exit code {code}): {self.server.log_summary()}"
        return f"log: {self.server.log_path}"

    def _check_running(self) -> None:
        if not self.server.alive():
            raise EngineError(f"engine 'vllm' is not running; {self._describe()}")

    @contextlib.contextmanager
    def _generating(self):
        with self._cond:
            if not self._cond.wait_for(lambda: not self._syncing, timeout=self.config.sync_timeout_s):
                raise EngineError(f"engine 'vllm' weight sync did not finish in time; {self._describe()}")
            self._in_flight += 1
            version = self._version
        try:
            yield version
        finally:
            with self._cond:
                self._in_flight -= 1
                self._cond.notify_all()

    def sample(self, request: SampleRequest) -> list[Sample]:
        seeds = request_seeds(request)
        self._check_running()
        with self._generating() as version:
            out = self.client.complete(request.prompts, request.params, seeds, request.max_new_tokens)
        for s in out:
            s.policy_version = version
        return out

    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """Engine log-probs of each sequence's tokens 1..T-1 (temperature 1): the trainer-engine check."""
        self._check_running()
        with self._generating():
            return self.client.score(sequences)

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], *, version: int) -> None:
        """Stream, reload and reset the prefix cache; raises :class:`EngineError` instead of hanging."""
        self._check_running()
        deadline = time.monotonic() + self.config.sync_timeout_s
        with self._cond:
            self._syncing = True
            try:
                if not self._cond.wait_for(lambda: self._in_flight == 0, timeout=self.config.sync_timeout_s):
                    raise EngineError(f"engine 'vllm': generation still running at sync; {self._describe()}")
            except BaseException:
                self._syncing = False
                self._cond.notify_all()
                raise
        try:
            if self.config.weight_transfer == "worker":
                self._sync(named_tensors, deadline)
            else:
                self._sync_native(named_tensors, deadline)
            self._version = version
        finally:
            with self._cond:
                self._syncing = False
                self._cond.notify_all()

    def _remaining(self, deadline: float) -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise EngineError(
                f"engine 'vllm' weight sync took longer than {self.config.sync_timeout_s:.0f} s; "
                f"{self._describe()}"
            )
        return left

    def _rpc(self, method: str, arg: str, deadline: float) -> list[str]:
        left = self._remaining(deadline)
        body = {"method": method, "args": [arg], "timeout": left}
        out = self.client.post("/collective_rpc", body, timeout_s=left + 5, what=f"weight sync ({method})")
        return list((out or {}).get("results") or [])

    def _sync(self, named_tensors: Iterable[tuple[str, torch.Tensor]], deadline: float) -> None:
        sent: list[str] = []

        def counted() -> Iterable[tuple[str, torch.Tensor]]:
            for name, t in engine_names(named_tensors):
                sent.append(name)
                yield name, t

        stream = buckets(counted(), bucket_bytes=self.config.bucket_bytes)
        stage = None
        try:
            paths: list[str] = []
            if self.config.transport == "file":
                stage = Path(tempfile.mkdtemp(prefix="cadenza-sync-", dir=self.config.stage_dir or _shm()))
            for i, bucket in enumerate(stream):
                data = to_safetensors_bytes(bucket)
                if stage is not None:
                    path = stage / f"{i:06d}.safetensors"
                    path.write_bytes(data)
                    paths.append(str(path))
                else:
                    self._rpc("cadenza_stage", base64.b64encode(data).decode(), deadline)
                self._remaining(deadline)
            results = self._rpc("cadenza_reload", json.dumps({"paths": paths or None}), deadline)
            if not results:
                raise EngineError(f"engine 'vllm' weight reload returned nothing; {self._describe()}")
            for result in results:  # one per worker
                check_received(sent, json.loads(result))
            self._reset_prefix_cache(deadline)
        finally:
            if stage is not None:
                shutil.rmtree(stage, ignore_errors=True)

    def _sync_native(self, weights: Iterable[tuple[str, torch.Tensor]], deadline: float) -> None:
        """vLLM's NCCL / CUDA-IPC transfer (GPU): needs the metadata that :class:`ModuleWeights` carries."""
        from cadenza.rl.engines.gpu_sync import ModuleWeights, NativeSyncConfig, NativeWeightSync

        if not isinstance(weights, ModuleWeights):
            raise CadenzaError(
                f"weight_transfer={self.config.weight_transfer!r} needs sync_weights(ModuleWeights(model)), "
                "not a plain tensor stream (the transfer declares names and shapes before sending)"
            )
        if self._native is None:
            cfg = NativeSyncConfig(backend=self.config.weight_transfer, timeout_s=self._remaining(deadline))
            self._native = NativeWeightSync(self.server.base_url, weights, cfg)
        self._native.push(weights)  # this sync's stream (a sharded trainer's is read once)
        self._reset_prefix_cache(deadline)

    def _reset_prefix_cache(self, deadline: float) -> None:
        """KV computed with the old weights must not be reused (it is a 1.2 log-prob error)."""
        while True:
            out = self.client.post(
                "/reset_prefix_cache", None, timeout_s=self._remaining(deadline), what="prefix-cache reset"
            )
            if out is None or not isinstance(out, dict) or out.get("success", True):
                return
            time.sleep(0.05)

    def close(self) -> None:
        if self._native is not None:
            with contextlib.suppress(Exception):
                self._native.close()
            self._native = None
        self.server.stop()

    def __enter__(self) -> VLLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _shm() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
