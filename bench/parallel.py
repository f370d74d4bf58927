"""Dual-mesh (experts on their own EP mesh) vs one shared FSDP mesh, same model, world 8, gloo/CPU.

Prints ONE JSON object: per layout, the bytes each collective moves in one training step (summed
over ranks) and the step time. Bytes are counted by wrapping the ``torch.distributed`` collectives
(FSDP2's all_gather_single / reduce_scatter_single, the EP all_to_all_single, CP all-gathers,
all_reduce) and computing, from the tensor sizes at each call, what a rank sends under the usual
algorithms: all-gather and reduce-scatter (n-1)/n of the full buffer, all-reduce 2(n-1)/n
(ring), all-to-all the rows addressed to other ranks.

Layouts, both at world 8 with CP=2:
* ``dual``:   dense FSDP over (dp_shard·cp = 8), experts EP=8 (each rank owns 2 of 16 experts,
              no FSDP traffic for them, tokens move by all-to-all);
* ``shared``: everything FSDP-sharded over the same 8 ranks (EP=1): every step all-gathers every
              expert of every layer, forward and backward, and reduce-scatters their gradients.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WORLD, SEQ, BATCH, STEPS = 8, 64, 2, 3
LAYOUTS = {"dual": dict(dp_shard=4, cp=2, ep=8), "shared": dict(dp_shard=4, cp=2, ep=1)}


def _model():
    import torch
    from transformers import Qwen3MoeForCausalLM

    from cadenza.rl.engines.policy import tiny_qwen3_moe_config

    torch.manual_seed(0)
    cfg = tiny_qwen3_moe_config(
        512, hidden_size=128, intermediate_size=256, moe_intermediate_size=128, head_dim=32, num_experts=16,
        max_position_embeddings=SEQ, norm_topk_prob=False,
    )  # fmt: skip
    cfg._attn_implementation = "sdpa"
    return Qwen3MoeForCausalLM(cfg).float()


def _install_counter(counts: dict) -> None:
    import torch.distributed as dist

    def size(group) -> int:
        return dist.get_world_size(group)

    def nbytes(t) -> int:
        return t.numel() * t.element_size()

    def wrap(name, cost):
        original = getattr(dist, name)

        def wrapper(*args, **kwargs):
            if counts.get("_on"):
                counts[name] += cost(*args, **kwargs)
            return original(*args, **kwargs)

        setattr(dist, name, wrapper)

    def gather_cost(output, input, group=None, **_):
        n = size(group)
        return nbytes(output) * (n - 1) // n

    def scatter_cost(output, input, op=None, group=None, **_):
        n = size(group)
        return nbytes(input) * (n - 1) // n

    def reduce_cost(tensor, op=None, group=None, **_):
        n = size(group)
        return 2 * nbytes(tensor) * (n - 1) // n

    def a2a_cost(output, input, output_split_sizes=None, input_split_sizes=None, group=None, **_):
        n = size(group)
        rows = input.shape[0] if input.ndim else 1
        splits = input_split_sizes or [rows // n] * n
        own = splits[dist.get_rank(group)]
        row_bytes = nbytes(input) // max(rows, 1)
        return (rows - own) * row_bytes

    for name in ("all_gather_single", "all_gather_into_tensor"):
        if hasattr(dist, name):
            wrap(name, gather_cost)
    for name in ("reduce_scatter_single", "reduce_scatter_tensor"):
        if hasattr(dist, name):
            wrap(name, scatter_cost)
    wrap("all_reduce", reduce_cost)
    wrap("all_to_all_single", a2a_cost)


def _bench(rank: int, world: int) -> dict:
    import torch

    from cadenza.optim.clip import clip_grad_norm_
    from cadenza.parallel import ParallelDims, build_meshes, parallelize

    counts: dict = defaultdict(int)
    _install_counter(counts)
    out = {}
    for name, dims_kw in LAYOUTS.items():
        meshes = build_meshes(ParallelDims(**dims_kw))
        pm = parallelize(_model(), meshes)
        opt = torch.optim.AdamW(pm.parameters(), lr=1e-3, foreach=False)
        g = torch.Generator().manual_seed(meshes.dims.dp_rank(rank))
        times = []
        for step in range(STEPS + 1):
            ids = torch.randint(0, 512, (BATCH, SEQ), generator=g)
            counts.clear()
            counts["_on"] = (
                step == STEPS
            )  # count the last step only (all steps move the same bytes up to routing)
            torch.distributed.barrier()
            t0 = time.perf_counter()
            loss = pm(input_ids=ids, labels=ids).loss
            loss.backward()
            clip_grad_norm_(list(pm.parameters()), 1.0)
            opt.step()
            opt.zero_grad()
            if step:
                times.append(time.perf_counter() - t0)
        counts.pop("_on")
        experts = sum(p.to_local().numel() for n, p in pm.model.named_parameters() if ".experts." in n)
        out[name] = {
            "bytes": dict(counts),
            "step_s": statistics.median(times),
            "local_expert_params": experts,
            "loss": float(loss),
        }
    return out


def main() -> None:
    from cadenza.testing import spawn

    t0 = time.perf_counter()
    per_rank = spawn(_bench, WORLD)
    result = {
        "world_size": WORLD,
        "seq_len": SEQ,
        "batch_per_dp_rank": BATCH,
        "model": "Qwen3-MoE hidden 128, 2 layers, 16 experts top-2, float32",
        "bytes_method": "wrapped torch.distributed collectives; per call (n-1)/n of the buffer for "
        "all-gather/reduce-scatter, 2(n-1)/n for all-reduce, off-rank rows for all-to-all; "
        "summed over ranks, one step",
    }
    for name, dims_kw in LAYOUTS.items():
        collectives: dict[str, int] = defaultdict(int)
        for r in per_rank:
            for k, v in r[name]["bytes"].items():
                collectives[k.replace("_into_tensor", "_single").replace("_tensor", "_single")] += v
        result[name] = {
            "dims": dims_kw,
            "bytes_per_step": dict(collectives),
            "total_bytes_per_step": sum(collectives.values()),
            "step_seconds": max(r[name]["step_s"] for r in per_rank),
            "expert_params_per_rank": per_rank[0][name]["local_expert_params"],
        }
    result["bytes_ratio_shared_over_dual"] = round(
        result["shared"]["total_bytes_per_step"] / max(result["dual"]["total_bytes_per_step"], 1), 3
    )
    result["bench_seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
