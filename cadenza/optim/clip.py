"""Global gradient-norm clipping across parameters that live on different device meshes.

``torch.nn.utils.clip_grad_norm_`` stacks per-parameter norms, which fails when DTensors sit on
two meshes (dense and expert in dual-mesh HSDP). Here each parameter contributes the p-th power
of its *local* shard norm, summed per (mesh, sharded mesh dims) group and all-reduced only over
the mesh dimensions along which it is sharded (a replicated dimension already holds the whole
value), so the result equals the single-process norm on every rank. A ``Partial`` gradient (a pending sum)
is reduced first: the norm of a sum is not the sum of the parts' norms.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import Replicate


def _group_key(grad: torch.Tensor) -> tuple:
    if isinstance(grad, DTensor):
        # After _without_partial, anything not replicated is split across that mesh dim: Shard and
        # also _StridedShard (FSDP2 over an EP/TP DTensor), which is not a Shard subclass.
        dims = tuple(i for i, p in enumerate(grad.placements) if not p.is_replicate())
        return (id(grad.device_mesh), dims)
    return (None, ())


def _without_partial(grad: torch.Tensor) -> torch.Tensor:
    if not isinstance(grad, DTensor) or not any(p.is_partial() for p in grad.placements):
        return grad
    return grad.redistribute(
        grad.device_mesh, [Replicate() if p.is_partial() else p for p in grad.placements]
    )


def total_grad_norm(parameters: Iterable[torch.Tensor], norm_type: float = 2.0) -> torch.Tensor:
    """The norm of all gradients together, as if every parameter were whole on one process."""
    norm_type = float(norm_type)
    groups: dict[tuple, list[torch.Tensor]] = {}
    meshes = {}
    for p in parameters:
        if p.grad is None:
            continue
        grad = _without_partial(p.grad)
        key = _group_key(grad)
        groups.setdefault(key, []).append(grad)
        if key[0] is not None:
            meshes[key[0]] = grad.device_mesh
    device = next((g[0].device for g in groups.values()), torch.device("cpu"))
    total = torch.zeros((), dtype=torch.float64, device=device)
    for (mesh_id, dims), grads in groups.items():
        locals_ = [g.to_local() if mesh_id is not None else g for g in grads]
        if math.isinf(norm_type):
            part = torch.stack(
                [t.detach().abs().max().double() if t.numel() else total.new_zeros(()) for t in locals_]
            ).max()
        else:
            part = sum((t.detach().double().abs().pow(norm_type).sum() for t in locals_), total.new_zeros(()))
        if mesh_id is not None:
            mesh = meshes[mesh_id]
            op = dist.ReduceOp.MAX if math.isinf(norm_type) else dist.ReduceOp.SUM
            for d in dims:
                dist.all_reduce(part, op=op, group=mesh.get_group(d))
        total = torch.maximum(total, part) if math.isinf(norm_type) else total + part
    return total if math.isinf(norm_type) else total.pow(1.0 / norm_type)


def clip_grad_norm_(
    parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0
) -> torch.Tensor:
    """Scale gradients in place so their global norm is at most ``max_norm``; returns the norm before
    clipping."""
    params = [p for p in parameters if p.grad is not None]
    norm = total_grad_norm(params, norm_type)
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for p in params:
        p.grad.mul_(coef.to(dtype=p.grad.dtype))
    return norm.float()
