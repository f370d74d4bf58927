"""The trainer's served engines as Ray actors (``rollout.engine_placement = "ray"``).

With ``executor = "ray"`` the engines join the rollout actors' cluster (:class:`RayWorkers` starts them
once Ray is up, and the actors reach them through their handles); with ``executor = "local"`` the
trainer connects to (or starts) a cluster just for the engines and samples through the router in this
process. Either way the engines are :class:`~cadenza.rl.engines.ray_engine.RayEngine` clients, so the
router, the weight sync and the parity probe treat them as local servers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch

from cadenza.rl.engines.policy import HFPolicy, Sample, SampleRequest
from cadenza.rl.engines.ray_engine import RayEngine, RayEnginePlacement, start_ray_engines

if TYPE_CHECKING:
    from cadenza.rl.config import TrainConfig


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
    from cadenza.rl.train.local_engine import engine_options

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
