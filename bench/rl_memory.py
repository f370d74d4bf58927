"""Per-rank bytes of the RL policy's parameters, gradients and optimizer state on the dual mesh.

Prints ONE JSON object: for world 1, 2, 4, 8 (gloo ranks on this machine, ``[parallel] ep = world``,
``dp_shard`` filling) the largest per-rank parameter + gradient + optimizer-state bytes of the policy
after one Muon step, built and sharded by the trainer's own code
(:func:`cadenza.rl.train.sharding.shard`, :func:`cadenza.rl.train.build.build_optimizer`), the ratio
to the single-process figure, and the bytes rank 0 keeps besides: its unsharded rollout copy (the
weights engines sample from and sync with; parameters only, no gradients or optimizer state).

Model: Qwen3-MoE, hidden 256, 2 layers, 8 experts of 256, vocab 2048 (4.59M parameters, 18.4 MB in float32).
"""

from __future__ import annotations

import json
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
    from cadenza.rl.train.data_parallel import DataParallel
    from cadenza.rl.train.sharding import ShardedHFPolicy, shard

    torch.set_num_threads(1)
    conf = tiny_qwen3_moe_config(
        2048, hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, moe_intermediate_size=256, num_experts=8, num_experts_per_tok=2,
    )  # fmt: skip
    policy = HFPolicy.from_config(conf, seed=0)
    cfg = TrainConfig(model=ModelConfig(), optim=OptimConfig(name="muon"), parallel=ParallelDims(ep=world))
    cfg.probe.every = 0
    rollout_bytes = 0
    if world > 1:
        shards = shard(cfg, DataParallel.join(), policy, {})
        rollout_bytes = sum(_nbytes(p) for p in shards.rollout.model.parameters()) if shards.rollout else 0
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
    return {"params": params, "grads": grads, "optimizer_state": state, "rollout_copy": rollout_bytes}


def _rank(rank: int, world: int) -> dict:
    return _measure(rank, world)


def main() -> None:
    from cadenza.testing import spawn

    out: dict = {"model": "qwen3_moe hidden 256, 2 layers, 8 experts, vocab 2048", "optimizer": "muon"}
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
            "rank0_rollout_copy_bytes": ranks[0]["rollout_copy"],
            "ratio_to_single": round(max(per_rank) / single, 4),
            "ideal_ratio": round(1 / world, 4),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
