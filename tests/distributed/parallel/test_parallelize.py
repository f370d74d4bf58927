"""Dual-mesh FSDP2 + EP + CP on real gloo ranks against a float64 single-process reference.

One spawn per layout; inside it both tiny models (Qwen3-MoE and DeepSeek-V3) are checked: the loss
of every rank's batch, all gathered gradients, the global grad norm, the meshes the parameters live
on, and the loss after one AdamW step.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from cadenza.testing import spawn
from tests.support.tiny_moe import PRELOAD, batches, reference, tiny_model

SEQ, BATCH, LR = 16, 2, 1e-2


def _adamw(params):
    return torch.optim.AdamW(params, lr=LR, weight_decay=0.1, foreach=False)


def _check_layouts(rank: int, world: int, layouts: list[dict]) -> list[list[dict]]:
    return [_check_layout(rank, dims_kw, ac, kinds) for dims_kw, ac, kinds in layouts]


def _check_layout(
    rank: int, dims_kw: dict, activation_checkpointing: bool, kinds: tuple[str, ...]
) -> list[dict]:
    import time

    from cadenza.optim.clip import total_grad_norm
    from cadenza.parallel import ParallelDims, ParallelOptions, build_meshes, parallelize

    t0 = time.perf_counter()
    meshes = build_meshes(ParallelDims(**dims_kw))
    dims = meshes.dims
    report = []
    for kind in kinds:
        model = tiny_model(kind)
        data = batches(dims.dp, BATCH, SEQ, model.config.vocab_size)
        if rank == 0:
            ref_losses, ref_grads = reference(model, data)
            ref = __import__("copy").deepcopy(model).double()
            for n, p in ref.named_parameters():
                p.grad = ref_grads[n].clone()
            ref_norm = float(torch.sqrt(sum((g**2).sum() for g in ref_grads.values())))
            _adamw(ref.parameters()).step()
            with torch.no_grad():
                ref_after = [float(ref(input_ids=b, labels=b).loss) for b in data]
        pm = parallelize(model, meshes, ParallelOptions(activation_checkpointing=activation_checkpointing))
        mine = data[dims.dp_rank(rank)]
        out = pm(input_ids=mine, labels=mine)
        out.loss.backward()
        norm = float(total_grad_norm(pm.parameters()))
        rec = {
            "kind": kind,
            "loss": float(out.loss),
            "dp_rank": dims.dp_rank(rank),
            "norm": norm,
            "meshes": {},
            "grad_err": {},
        }
        for name, p in pm.model.named_parameters():
            rec["meshes"][name] = (tuple(p.device_mesh.mesh_dim_names), [str(x) for x in p.placements])
            full = p.grad.full_tensor()
            if rank == 0:
                want = ref_grads[name]
                rec["grad_err"][name] = float(
                    (full.double() - want).abs().max() / want.abs().max().clamp(min=1e-12)
                )
        opt = _adamw(pm.parameters())
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            rec["loss_after"] = float(pm(input_ids=mine, labels=mine).loss)
        if rank == 0:
            rec.update(ref_losses=ref_losses, ref_norm=ref_norm, ref_after=ref_after)
        rec["seconds"] = time.perf_counter() - t0
        report.append(rec)
        dist.barrier()
    return report


def _assert_matches(results: list[list[dict]], dims_kw: dict) -> None:
    for k, rank0 in enumerate(results[0]):
        bad = {n: e for n, e in rank0["grad_err"].items() if e > 1e-5}
        assert not bad, (rank0["kind"], bad)
        for per_rank in results:
            rec = per_rank[k]
            want = rank0["ref_losses"][rec["dp_rank"]]
            assert abs(rec["loss"] - want) / want < 1e-5, (rec["kind"], rec["loss"], want)
            assert abs(rec["norm"] - rank0["ref_norm"]) / rank0["ref_norm"] < 1e-5
            after = rank0["ref_after"][rec["dp_rank"]]
            assert abs(rec["loss_after"] - after) / after < 1e-4, (rec["kind"], rec["loss_after"], after)
        meshes = rank0["meshes"]
        experts = {n: m for n, m in meshes.items() if ".mlp.experts." in n}
        dense = {n: m for n, m in meshes.items() if n not in experts}
        assert experts and dense
        assert {m[0] for m in dense.values()} == {("dp_replicate", "dp_shard_cp")}
        ep = dims_kw.get("ep", 1)
        for names, placements in experts.values():
            assert "efsdp" in names and names != ("dp_replicate", "dp_shard_cp")
            if ep > 1:  # experts split over ep on dim 0, FSDP-sharded over efsdp
                assert names == ("dp_replicate", "efsdp", "ep") and placements[-1] == "S(0)", (
                    names,
                    placements,
                )


# (dims, activation checkpointing, models). With checkpointing the recompute in backward must redo the
# EP/CP collectives identically; "deepseek_v3_starved" leaves the second EP rank's experts without
# tokens, which must still join FSDP's gradient reduction (zero gradients) instead of hanging.
MODELS = ("qwen3_moe", "deepseek_v3")
LAYOUTS = {
    8: [
        (dict(dp_shard=-1, cp=2, ep=8), False, MODELS),
        (dict(dp_replicate=2, dp_shard=2, cp=2, ep=4), True, MODELS),
    ],
    4: [(dict(dp_shard=4, ep=2), False, (*MODELS, "deepseek_v3_starved"))],
}


@pytest.mark.slow
@pytest.mark.parametrize("world", sorted(LAYOUTS, reverse=True))
def test_matches_single_process(world: int) -> None:
    """One spawn per world size (process start dominates); every layout of that size inside it."""
    per_rank = spawn(_check_layouts, world, LAYOUTS[world], preload=PRELOAD)
    for i, (dims_kw, _, _) in enumerate(LAYOUTS[world]):
        print(dims_kw, [round(r["seconds"], 1) for r in per_rank[0][i]])
        _assert_matches([r[i] for r in per_rank], dims_kw)
