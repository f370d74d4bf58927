"""Muon under ``parallelize`` with expert parallelism (real gloo ranks, one spawn at world 4).

1. dp_shard=4, ep=2: the routed experts are FSDP2 DTensors on the expert mesh with
   ``(Replicate, _StridedShard(0), Shard(0))``; two Muon steps built by ``cadenza pretrain``'s optimizer
   factory (per-head / per-expert groups, AdamW for embeddings and norms) on the parallelized model equal
   the same steps of an unsharded single-process Muon on the same (gathered) gradients, NS in float32.
2. ``cadenza pretrain`` with ``optimizer = "muon"`` at cp=2, ep=4 trains (the loss goes down), and a
   run resumed from a mid-way checkpoint (Muon momentum and AdamW state) repeats the same losses.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from cadenza.testing import spawn
from tests.support.tiny_moe import PRELOAD

STEPS = 6


def _config(root: Path, files: list[Path]) -> Path:
    listed = ", ".join(json.dumps(str(f)) for f in files)
    path = root / "muon.toml"
    path.write_text(f"""
[model]
path = "model"
[data]
files = [{listed}]
seq_len = 16
[parallel]
dp_shard = 2
cp = 2
ep = 4
[train]
steps = {STEPS}
global_batch = 4
lr = 1e-2
warmup_steps = 1
schedule = "wsd"
optimizer = "muon"
[muon]
granular = true
adjust_lr = "match_rms_adamw"
ns_dtype = "bfloat16"
adamw_lr = 5e-3
[checkpoint]
every = 3
keep = 2
[output]
dir = "out"
progress = false
""")
    return path


def _write_corpus(root: Path) -> list[Path]:
    """Documents cycling through the vocabulary from random offsets: the next word is predictable,
    so a model that trains shows it within a few steps (uniformly random words would not)."""
    import random

    from tests.support.pretrain_fixtures import WORDS

    rng = random.Random(0)
    root.mkdir(parents=True, exist_ok=True)
    docs = []
    for _ in range(60):
        start = rng.randrange(len(WORDS))
        docs.append(" ".join(WORDS[(start + i) % len(WORDS)] for i in range(rng.randint(20, 60))))
    path = root / "cycles.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return [path]


def _sharded_equals_unsharded(rank: int) -> dict:
    import copy

    import torch

    from cadenza.optim.build import MuonConfig, build_optimizer
    from cadenza.parallel import ParallelDims, parallelize
    from tests.support.tiny_moe import batches, tiny_model

    model = tiny_model("qwen3_moe")
    ref = copy.deepcopy(model)
    pm = parallelize(model, ParallelDims(dp_shard=4, ep=2))
    settings = MuonConfig(ns_dtype="float32", adamw_lr=3e-3)
    kw = dict(lr=2e-2, weight_decay=0.1, betas=(0.9, 0.95), muon=settings)
    opt, ref_opt = build_optimizer("muon", pm.model, **kw), build_optimizer("muon", ref, **kw)
    granularity = {
        n: g.get("granularity") if g["algorithm"] == "muon" else "adamw"
        for g in opt.param_groups
        for n in g["param_names"]
    }
    data = batches(2, 4, 16, model.config.vocab_size)
    errors: dict[str, float] = {}
    for step in range(2):
        ids = data[step][rank : rank + 1]
        pm(input_ids=ids, labels=ids).loss.backward()
        ref_params = dict(ref.named_parameters())
        for name, p in pm.model.named_parameters():
            ref_params[name].grad = p.grad.full_tensor()
        before = {n: p.detach().clone() for n, p in ref_params.items()}
        opt.step()
        ref_opt.step()
        opt.zero_grad(set_to_none=True)
        ref_opt.zero_grad(set_to_none=True)
        for name, p in pm.model.named_parameters():
            want = ref_params[name].detach()
            moved = float((want - before[name]).norm())
            assert moved > 0, name
            errors[name] = max(errors.get(name, 0.0), float((p.detach().full_tensor() - want).norm()) / moved)
    placements = {n: str(p.placements) for n, p in pm.model.named_parameters()}
    # Where Muon thinks this rank's shard sits must be where DTensor says it is (Muon's result is blind to
    # a consistent relabelling of whole experts, so this is checked directly).
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    from cadenza.optim.layout import layout_of

    boxes = {}
    for name, p in pm.model.named_parameters():
        shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
        want = [(o, o + n) for o, n in zip(offset, shape, strict=True) if n]
        got = [(lo, hi) for lo, hi in layout_of(p).box_of(rank) if hi > lo]
        boxes[name] = got == want and tuple(p.to_local().shape) == tuple(shape)
    errors.update(_strided_matrices(pm.meshes.expert))
    del pm, opt
    torch.distributed.barrier()
    return {"errors": errors, "placements": placements, "granularity": granularity, "boxes": boxes}


def _strided_matrices(mesh) -> dict[str, float]:
    """Matrices and heads spanning several uneven shards of the expert mesh's strided layout: pieces
    travel between ranks (EP experts never do: each sits whole on one rank)."""
    import torch
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.placement_types import _StridedShard

    from cadenza.optim import Muon

    placements = [Replicate(), _StridedShard(0, split_factor=mesh.size(2)), Shard(0)]
    gen = torch.Generator().manual_seed(5)
    specs = {"matrix": ((22, 8), {}), "head": ((26, 8), {"head_dim": 13})}
    fulls = {
        k: (torch.randn(shape, generator=gen), torch.randn(shape, generator=gen))
        for k, (shape, _) in specs.items()
    }
    sharded, plain = [], []
    for k, (_, kw) in specs.items():
        w, g = fulls[k]
        p = torch.nn.Parameter(distribute_tensor(w, mesh, placements, src_data_rank=None))
        p.grad = distribute_tensor(g, mesh, placements, src_data_rank=None)
        q = torch.nn.Parameter(w.clone())
        q.grad = g.clone()
        sharded.append({"params": [p], "granularity": k, **kw})
        plain.append({"params": [q], "granularity": k, **kw})
    for groups in (sharded, plain):
        Muon(groups, lr=0.1, weight_decay=0.1, ns_dtype=torch.float32).step()
    out = {}
    for k, s, q in zip(specs, sharded, plain, strict=True):
        got, want = s["params"][0].detach().full_tensor(), q["params"][0].detach()
        out[f"strided {k}"] = float((got - want).norm() / (want - fulls[k][0]).norm())
    return out


def _run(rank: int, world: int, root: str) -> dict:
    import torch.distributed as dist

    from cadenza.pretrain.config import load_config
    from cadenza.pretrain.loop import run
    from tests.support.pretrain_fixtures import train_tokenizer, write_model

    out = _sharded_equals_unsharded(rank)
    base = Path(root)
    if rank == 0:
        files = _write_corpus(base / "data")
        write_model(base / "model", "qwen3_moe", train_tokenizer(files))
        _config(base, files)
    dist.barrier()
    cfg = load_config(base / "muon.toml")
    out["summary"] = run(cfg)
    # Lose the last checkpoint: the rerun resumes at step 3 from the Muon state and must repeat steps 4-6.
    if rank == 0:
        out["uninterrupted"] = (base / "out" / "metrics.jsonl").read_text()
        shutil.rmtree(base / "out" / "checkpoints" / f"step-{STEPS:08d}")
    dist.barrier()
    out["resumed"] = run(cfg)
    return out


def test_muon_with_expert_parallel_equals_unsharded_and_pretrains(tmp_path: Path) -> None:
    results = spawn(_run, 4, str(tmp_path), preload=PRELOAD)
    first = results[0]
    experts = [n for n in first["placements"] if "experts" in n]
    assert experts and all("_StridedShard" in first["placements"][n] for n in experts), first["placements"]
    g = first["granularity"]
    assert g["model.layers.0.self_attn.q_proj.weight"] == "head"
    assert g["model.layers.0.mlp.experts.gate_up_proj"] == "expert"
    assert g["model.embed_tokens.weight"] == g["lm_head.weight"] == g["model.norm.weight"] == "adamw"
    for r in results:
        assert all(r["boxes"].values()), r["boxes"]
        worst = max(r["errors"], key=r["errors"].get)
        assert r["errors"][worst] < 1e-5, (worst, r["errors"][worst])

    def losses(text: str) -> list[float]:
        records = [json.loads(line) for line in text.splitlines()]
        assert [m["step"] for m in records] == list(range(1, STEPS + 1))
        return [m["loss"] for m in records]

    want = losses(first["uninterrupted"])
    assert want[-1] < want[0] - 0.5, want
    assert all(r["summary"]["last"]["step"] == STEPS for r in results)
    assert all(r["resumed"]["start_step"] == 3 for r in results)
    got = losses((tmp_path / "out" / "metrics.jsonl").read_text())
    assert got[:3] == want[:3]
    for step in range(3, STEPS):
        assert abs(got[step] - want[step]) <= 1e-5 * want[step], (step + 1, got[step], want[step])
    assert len(list((tmp_path / "out" / "checkpoints" / f"step-{STEPS:08d}").glob("*.distcp"))) == 4
