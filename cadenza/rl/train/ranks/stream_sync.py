"""Engine syncs straight from the shards: every rank gathers one full tensor at a time, rank 0 feeds the
engine's buckets (the rest of this module's story is in the comment below)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from cadenza.rl.engines.gpu_sync import ShardStream

if TYPE_CHECKING:
    from cadenza.rl.config import TrainConfig


# ---------------------------------------------------------------- engine syncs straight from the shards
# A served engine (``vllm``) takes the weights as a stream of ``(name, full tensor)``. Under ``[parallel]``
# each full tensor is a collective (``DTensor.full_tensor()``), so every rank walks the sharded model's
# parameters in the same order, on the trainer's thread, at the same point of the step: rank 0 hands each
# tensor to the engine's bucketed sync (``VLLMEngine`` buckets of ``bucket_bytes``), the other ranks drop
# it. No rank holds the whole model: beyond its shard, rank 0 holds the full tensor being gathered plus
# the bucket being staged (at most ``bucket_bytes``, plus one serialised copy of it), and the other ranks
# one full tensor. The largest full tensor is one layer's stacked routed experts (``gate_up_proj
# [E, 2I, H]``): that is the unit the bound is stated in, since the per-expert views the engine loads
# keep it alive until their bucket is sent.
#
# The ``hf`` engine (and the hint-following probe) sample from an unsharded copy on rank 0 instead
# (:class:`ShardedPolicy` keeps it only then: :func:`needs_rollout_copy`).
#
# If rank 0's engine call fails half-way, rank 0 still drains the stream, so the other ranks finish their
# collectives, and the error reaches every rank through :func:`~cadenza.parallel.launch.share_from_rank0`.
# With ``rollout.max_staleness > 0`` rank 0 first waits (on the trainer's thread) until the rollouts queued
# ahead of the sync are done, then streams while the rollout thread is held (``RolloutPipeline.sync(...,
# here=True)``): the order of syncs and rollouts is the synchronous schedule's, as without sharding.


def needs_rollout_copy(cfg: TrainConfig) -> bool:
    """Whether rank 0 keeps an unsharded copy of the policy: the ``hf`` engine samples from it and the
    hint-following probe scores it; a ``vllm`` engine is synced from the shards and needs none."""
    return cfg.rollout.engine == "hf" or cfg.probe.every > 0


def start_engine(trainer: Any, version: int) -> None:
    """Every rank, before the first rollouts: rank 0 builds the engine; a served engine that does not hold
    ``version`` yet (a resumed run) is synced from the shards before it samples."""
    behind = trainer.dp.share(lambda: trainer._engine_at(version, sync=False).version != version)
    if behind:
        stream_sync(trainer, version)


def stream_sync(trainer: Any, version: int) -> float:
    """Every rank: stream the sharded policy into rank 0's engine as ``version``; seconds (rank 0's).

    With ``rollout.sync_probe_tol`` the probe's trainer log-probs are computed first, by a forward of the
    sharded model on every rank; rank 0 compares the engine's after the sync."""
    probe = trainer._parity_probe()
    want = probe.trainer_logprobs(trainer.model) if probe is not None else None
    stream = ShardStream(trainer.model)
    if not trainer.dp.main:
        stream.drain()
    return trainer.dp.share(lambda: _feed(trainer, stream, version, want))


def _feed(trainer: Any, stream: ShardStream, version: int, want: torch.Tensor | None) -> float:
    """Rank 0: the engine reads the stream (through the rollout pipeline once it runs); always drained."""
    try:
        if trainer.pipeline is None:
            start = time.perf_counter()
            trainer._engine.sync_weights(stream, version=version)
            seconds = time.perf_counter() - start
        else:
            partial = trainer.cfg.rollout.partial_rollouts
            seconds = trainer.pipeline.sync(lambda: stream, version=version, partial=partial, here=True)
    finally:
        stream.drain()
    trainer._check_parity(version, want=want)
    return seconds
