"""Global grad-norm clipping across two meshes, and Muon's construction-time layout checks (gloo).

Gradients are DTensors on a 1-D mesh and on a 2-D (replicate x shard) mesh at once, with Shard(0),
Shard(1), Replicate and Partial placements; the reference is the float64 norm of the full gradients
computed from the same seed in one process.
"""

from __future__ import annotations

import math

import pytest
import torch

from cadenza.testing import spawn
from tests.support.tiny_moe import PRELOAD

SHAPES = [(7, 5), (12, 3), (4, 9), (6,), (3, 4, 5)]


def _full_grads():
    gen = torch.Generator().manual_seed(3)
    return [torch.randn(s, generator=gen, dtype=torch.float64).float() for s in SHAPES]


def _run(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

    from cadenza.errors import ConfigError
    from cadenza.optim import Muon, clip_grad_norm_, total_grad_norm

    flat = init_device_mesh("cpu", (world,))
    grid = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("rep", "shard"))
    layouts = [
        (flat, [Shard(0)]),
        (grid, [Replicate(), Shard(1)]),
        (flat, [Replicate()]),
        (grid, [Replicate(), Shard(0)]),
        (grid, [Shard(0), Shard(2)]),
    ]
    fulls = _full_grads()
    params = []
    for full, (mesh, pl) in zip(fulls, layouts, strict=True):
        p = torch.nn.Parameter(distribute_tensor(torch.zeros_like(full), mesh, pl))
        p.grad = distribute_tensor(full, mesh, pl)
        params.append(p)
    # a Partial gradient (pending sum over ranks): each rank holds full / world
    part = torch.nn.Parameter(distribute_tensor(torch.zeros(5, 2), flat, [Replicate()]))
    part_full = torch.arange(10.0).reshape(5, 2) - 3
    from torch.distributed.tensor import DTensor

    part.grad = DTensor.from_local(part_full / world, flat, [Partial()])
    params.append(part)
    plain = torch.nn.Parameter(torch.zeros(3))  # a replicated plain tensor counts once
    plain.grad = torch.tensor([1.0, -2.0, 0.5])
    params.append(plain)

    out = {
        "l2": float(total_grad_norm(params)),
        "l1": float(total_grad_norm(params, 1)),
        "linf": float(total_grad_norm(params, math.inf)),
    }
    before = float(clip_grad_norm_(params, max_norm=1.0))
    out["before"] = before
    out["after"] = float(total_grad_norm(params))
    out["scaled_first"] = params[0].grad.full_tensor().tolist()

    errors = []
    bad = torch.nn.Parameter(DTensor.from_local(torch.zeros(4, 4), flat, [Partial()]))
    for kwargs in (
        {"params": [bad]},
        {"params": [torch.nn.Parameter(torch.zeros(4))]},
        {"params": [torch.nn.Parameter(torch.zeros(8, 4))], "granularity": "head", "head_dim": 3},
        {"params": [torch.nn.Parameter(torch.zeros(8, 4))], "adjust_lr": "spectral"},
    ):
        try:
            Muon([kwargs])
            errors.append(None)
        except ConfigError as e:
            errors.append(str(e))
    out["errors"] = errors
    return out


def _reference(world: int) -> dict:
    grads = [g.double() for g in _full_grads()]
    grads.append((torch.arange(10.0).reshape(5, 2) - 3).double())
    grads.append(torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64))
    flat = torch.cat([g.flatten() for g in grads])
    return {
        "l2": float(flat.norm()),
        "l1": float(flat.abs().sum()),
        "linf": float(flat.abs().max()),
        "first": grads[0],
    }


@pytest.mark.parametrize("world", [2, 4])
def test_global_norm_and_clip_across_two_meshes(world):
    ref = _reference(world)
    for r in spawn(_run, world, preload=PRELOAD):
        for key in ("l2", "l1", "linf"):
            assert r[key] == pytest.approx(ref[key], rel=1e-6), key
        assert r["before"] == pytest.approx(ref["l2"], rel=1e-6)
        assert r["after"] == pytest.approx(1.0, rel=1e-5)
        expect = ref["first"] * (1.0 / (ref["l2"] + 1e-6))
        assert torch.allclose(torch.tensor(r["scaled_first"], dtype=torch.float64), expect, rtol=1e-5)
        partial_err, one_d, head, adjust = r["errors"]
        assert partial_err and "Partial" in partial_err
        assert one_d and "2-D parameter" in one_d and "adamw" in one_d
        assert head and "head_dim 3 does not divide 8" in head
        assert adjust and "spectral" in adjust
