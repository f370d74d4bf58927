"""Sharded Muon equals unsharded Muon for a tiny HF Qwen3-MoE under FSDP2 (real gloo ranks).

One spawn per world size; inside it three layouts: 1-D FSDP, HSDP (2-D mesh), and two meshes (dense
params on one, experts on another, as dual-mesh HSDP does). Dims are chosen so shards are uneven
(30 q rows, 10 k rows, 5 experts; FSDP2 allows uneven only on dim 0) and some ranks hold empty shards at
world 8.
The reference is the same optimizer on an unsharded copy fed the gathered FSDP gradients.
"""

from __future__ import annotations

import copy

import pytest
import torch

from cadenza.testing import spawn
from tests.support.tiny_moe import PRELOAD


def _tiny_moe():
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    cfg = Qwen3MoeConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=3,
        num_key_value_heads=1,
        head_dim=10,
        moe_intermediate_size=20,
        intermediate_size=40,
        num_experts=5,
        num_experts_per_tok=2,
        vocab_size=100,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg)


def _placement(name_of):
    from torch.distributed.tensor import Shard

    def fn(p):
        name = name_of.get(id(p), "")
        if name.endswith("experts.down_proj"):
            return Shard(1)  # [5, 64, 20]: every expert's rows spread over ranks (pieces from several ranks)
        if name.endswith("mlp.gate.weight"):
            return Shard(1)  # router [5, 64] sharded by columns
        # Shard(0), uneven where it matters (FSDP2 allows uneven shards on dim 0 only): q rows 30, k/v
        # rows 10, 5 experts of gate_up (each whole on one rank: no communication), o_proj per-head
        # column blocks spanning every rank's rows
        return Shard(0)

    return fn


def _shard(model, layout: str, world: int):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    flat = init_device_mesh("cpu", (world,))
    hsdp = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
    name_of = {id(p): n for n, p in model.named_parameters()}
    fn = _placement(name_of)
    dense, experts = {"1d": (flat, flat), "hsdp": (hsdp, hsdp), "two_mesh": (flat, hsdp)}[layout]
    for layer in model.model.layers:
        if layout == "two_mesh":
            fully_shard(layer.mlp.experts, mesh=experts, shard_placement_fn=fn)
        fully_shard(layer, mesh=dense, shard_placement_fn=fn)
    fully_shard(model, mesh=dense, shard_placement_fn=fn)
    return model


def _optimizer(model):
    from cadenza.optim import Muon, muon_param_groups

    return Muon(
        muon_param_groups(model, adamw_lr=1e-2, adamw_weight_decay=0.01),
        lr=0.05,
        weight_decay=0.1,
        ns_dtype=torch.float32,
        max_in_flight=3,
        bucket_numel=4096,
    )


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _train_step(rank, model, ref, opt, ref_opt, step):
    gen = torch.Generator().manual_seed(100 * step + rank)
    ids = torch.randint(0, 100, (2, 12), generator=gen)
    model(input_ids=ids, labels=ids).loss.backward()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        q.grad = _full(p.grad).clone()
    opt.step()
    ref_opt.step()
    opt.zero_grad()
    ref_opt.zero_grad()


def _layout_check(rank: int, world: int, layout: str) -> dict:
    from torch.distributed.tensor import DTensor

    from cadenza.optim import total_grad_norm

    ref = _tiny_moe()
    model = _shard(copy.deepcopy(ref), layout, world)
    init = {n: p.detach().clone() for n, p in ref.named_parameters()}
    opt, ref_opt = _optimizer(model), _optimizer(ref)
    _train_step(rank, model, ref, opt, ref_opt, 0)
    # clip: global norm over params on two meshes equals the float64 norm of the gathered grads
    gen = torch.Generator().manual_seed(7 + rank)
    ids = torch.randint(0, 100, (2, 12), generator=gen)
    model(input_ids=ids, labels=ids).loss.backward()
    fulls = [_full(p.grad).double() for p in model.parameters()]
    ref_norm = torch.cat([g.flatten() for g in fulls]).norm()
    clip_err = float(abs(total_grad_norm(model.parameters()) - ref_norm) / ref_norm)
    opt.zero_grad()
    _train_step(rank, model, ref, opt, ref_opt, 1)
    errs = {}
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        d_sharded, d_ref = _full(p).detach() - init[n], q.detach() - init[n]
        errs[n] = float((d_sharded - d_ref).norm() / d_ref.norm().clamp(min=1e-30))
    # resume: state dict saved now, loaded into a fresh optimizer, gives the identical next step
    snap = [p.to_local().detach().clone() for p in model.parameters()]
    saved = copy.deepcopy(opt.state_dict())
    ids = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(55 + rank))
    model(input_ids=ids, labels=ids).loss.backward()
    grads = [p.grad.detach().clone() for p in model.parameters()]
    opt.step()
    after = [p.to_local().detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p, s in zip(model.parameters(), snap, strict=True):
            p.to_local().copy_(s)
    fresh = _optimizer(model)
    fresh.load_state_dict(saved)
    for p, g in zip(model.parameters(), grads, strict=True):
        p.grad = g
    fresh.step()
    resumed = all(torch.equal(p.to_local(), a) for p, a in zip(model.parameters(), after, strict=True))
    uneven = any(isinstance(p, DTensor) and p.to_local().shape != _even_local(p) for p in model.parameters())
    owned = sum(len(jp.owned_ext) for jp in opt._plan_cache[1])
    items = sum(jp.items for jp in opt._plan_cache[1])
    nocomm_expert = all(not jp.comm for jp in opt._plan_cache[1] if jp.shape == (20, 64))
    return dict(
        errs=errs,
        clip_err=clip_err,
        resumed=resumed,
        uneven=uneven,
        owned=owned,
        items=items,
        nocomm_expert=nocomm_expert,
        transfers=opt.last_stats.transfers,
    )


def _even_local(p):
    shape = list(p.shape)
    for i, pl in enumerate(p.placements):
        if pl.is_shard():
            shape[pl.dim] = shape[pl.dim] // p.device_mesh.size(i)
    return torch.Size(shape)


def _run(rank: int, world: int) -> dict:
    return {layout: _layout_check(rank, world, layout) for layout in ("1d", "hsdp", "two_mesh")}


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4, 8])
def test_sharded_equals_unsharded(world):
    results = spawn(_run, world, preload=PRELOAD)
    for layout in ("1d", "hsdp", "two_mesh"):
        per_rank = [r[layout] for r in results]
        for r in per_rank:
            worst = max(r["errs"].items(), key=lambda kv: kv[1])
            assert worst[1] < 1e-5, (layout, worst)
            assert r["clip_err"] < 1e-9, (layout, r["clip_err"])
            assert r["resumed"], layout
        # every matrix is orthogonalised exactly once across ranks (replicas split the work)
        assert sum(r["owned"] for r in per_rank) == per_rank[0]["items"], layout
        assert all(r["transfers"] > 0 for r in per_rank), layout
    assert all(r["1d"]["nocomm_expert"] for r in results)
    assert results[0]["1d"]["uneven"], "test config must produce uneven shards"
