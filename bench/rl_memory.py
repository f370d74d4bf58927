"""Per-rank bytes of the RL policy's parameters, gradients and optimizer state on the dual mesh.

Prints ONE JSON object: for world 1, 2, 4, 8 (gloo ranks on this machine, ``[parallel] ep = world``,
``dp_shard`` filling) the largest per-rank parameter + gradient + optimizer-state bytes of the policy
after one Muon step, built and sharded by the trainer's own code
(:func:`cadenza.rl.train.ranks.sharding.shard`, :func:`cadenza.rl.train.build.build_optimizer`), the ratio
to the single-process figure; the frozen teacher's and the KL reference's parameters (sharded alike, no
gradients or optimizer state); and rank 0's total with and without the unsharded rollout copy. The copy
(parameters only) exists only for the ``hf`` engine or the hint-following probe; a ``vllm`` engine is synced
straight from the shards (``stream_sync``), whose transient on rank 0 is one full tensor being gathered (at
most ``largest_full_tensor_bytes``: a layer's stacked experts) plus the bucket being staged
(``bucket_bytes``, 256 MiB by default; it never exceeds the model's size). The run below measures the
rank-0 sync transient by streaming the shards once (every rank, as the trainer does). Records the commit
and the load average.

Model: Qwen3-MoE, hidden 256, 2 layers, 8 experts of 256, vocab 2048 (4.59M parameters, 18.4 MB in float32).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WORLDS = (1, 2, 4, 8)


def _nbytes(t) -> int:
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


def _measure(rank: int, world: int) -> dict:
    import torch

    from cadenza.rl.config import ModelConfig, OptimConfig, ParallelDims, TrainConfig
    from cadenza.rl.engines.policy import HFPolicy, tiny_qwen3_moe_config
    from cadenza.rl.train.build import build_optimizer
    from cadenza.rl.train.ranks.data_parallel import DataParallel
    from cadenza.rl.train.ranks.sharding import ShardedHFPolicy, shard

    torch.set_num_threads(1)
    conf = tiny_qwen3_moe_config(
        2048, hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, moe_intermediate_size=256, num_experts=8, num_experts_per_tok=2,
    )  # fmt: skip
    policy = HFPolicy.from_config(conf, seed=0)
    cfg = TrainConfig(model=ModelConfig(), optim=OptimConfig(name="muon"), parallel=ParallelDims(ep=world))
    cfg.probe.every, cfg.rollout.engine = 0, "vllm"  # no rollout copy: the sync streams from the shards
    copies = {name: copy.deepcopy(policy.model).requires_grad_(False) for name in ("teacher", "reference")}
    full_params = sum(_nbytes(p) for p in policy.model.parameters())
    largest = max(_nbytes(p) for p in policy.model.parameters())
    if world > 1:
        shards = shard(cfg, DataParallel.join(), policy, copies)
        assert shards.rollout is None
        policy = ShardedHFPolicy(policy.model, device="cpu")
    model = policy.model
    optimizer = build_optimizer(model, cfg)
    ids = torch.randint(0, 2048, (2, 32), generator=torch.Generator().manual_seed(rank))
    hidden, _ = policy.hidden_states(ids)
    policy.lm_head(hidden).float().logsumexp(-1).mean().backward()
    optimizer.step()
    params = sum(_nbytes(p) for p in model.parameters())
    grads = sum(_nbytes(p.grad) for p in model.parameters() if p.grad is not None)
    state = sum(
        _nbytes(v) for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)
    )
    streamed = _stream_peak(model)
    return {
        "params": params, "grads": grads, "optimizer_state": state, "rollout_copy": full_params,
        "teacher": sum(_nbytes(p) for p in copies["teacher"].parameters()),
        "reference": sum(_nbytes(p) for p in copies["reference"].parameters()),
        "largest_full_tensor": largest, "stream_peak": streamed,
    }  # fmt: skip


def _stream_peak(model) -> int:
    """Every rank gathers the shards once, as a sync does; the largest full tensor alive at once on this
    rank (the bucketing on rank 0 adds at most ``bucket_bytes``)."""
    from cadenza.rl.engines.gpu_sync import ShardStream

    stream = ShardStream(model)
    peak = 0
    for _name, full in stream._tensors():
        peak = max(peak, _nbytes(full))
    return peak


def _rank(rank: int, world: int) -> dict:
    return _measure(rank, world)


def main() -> None:
    from cadenza.testing import spawn

    out: dict = {"model": "qwen3_moe hidden 256, 2 layers, 8 experts, vocab 2048", "optimizer": "muon"}
    root = Path(__file__).resolve().parents[1]
    out["commit"] = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=30
    ).stdout.strip()
    out["load_average"] = [round(x, 2) for x in os.getloadavg()]
    single = None
    for world in WORLDS:
        ranks = [_measure(0, 1)] if world == 1 else spawn(_rank, world, preload=("torch", "transformers"))
        per_rank = [r["params"] + r["grads"] + r["optimizer_state"] for r in ranks]
        single = single or per_rank[0]
        out[f"world_{world}"] = {
            "max_rank_bytes": max(per_rank),
            "min_rank_bytes": min(per_rank),
            "params": max(r["params"] for r in ranks),
            "grads": max(r["grads"] for r in ranks),
            "optimizer_state": max(r["optimizer_state"] for r in ranks),
            "teacher_bytes": max(r["teacher"] for r in ranks),
            "reference_bytes": max(r["reference"] for r in ranks),
            # rank 0 in all: its trained-policy bytes plus the frozen teacher and the KL reference
            "rank0_total_bytes": per_rank[0] + ranks[0]["teacher"] + ranks[0]["reference"],
            # ... plus the unsharded rollout copy rank 0 keeps for the hf engine or the probe (world > 1)
            "rank0_total_with_rollout_copy_bytes": per_rank[0]
            + ranks[0]["teacher"]
            + ranks[0]["reference"]
            + (ranks[0]["rollout_copy"] if world > 1 else 0),
            "largest_full_tensor_bytes": ranks[0]["largest_full_tensor"],
            "rank0_stream_peak_tensor_bytes": ranks[0]["stream_peak"],
            "ratio_to_single": round(max(per_rank) / single, 4),
            "ideal_ratio": round(1 / world, 4),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
