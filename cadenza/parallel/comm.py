"""Differentiable collectives used by expert and context parallelism.

Written as small autograd functions over ``torch.distributed`` so they work on gloo (CPU) as
well as NCCL: the backward of an all-gather is a reduce-scatter (sum), the backward of an
all-to-all is the all-to-all with the splits swapped.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


# Recent torch names these *_single (the *_tensor spellings warn); older torch has only the latter.
# Looked up at call time so that wrappers installed on torch.distributed (bench/parallel.py) see them.
def _all_gather(*args, **kwargs):
    return (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(*args, **kwargs)


def _reduce_scatter(*args, **kwargs):
    return (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(*args, **kwargs)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
        ctx.group, ctx.out_splits, ctx.in_splits = group, out_splits, in_splits
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        back = grad.new_empty((sum(ctx.in_splits), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), ctx.in_splits, ctx.out_splits, group=ctx.group)
        return back, None, None, None


def all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
    """Send ``x`` rows ``in_splits[r]`` to rank ``r``; receive ``out_splits[r]`` rows from rank ``r``."""
    return _AllToAll.apply(x, list(out_splits), list(in_splits), group)


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        n = dist.get_world_size(group)
        out = x.new_empty((n * x.shape[0], *x.shape[1:]))
        _all_gather(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        n = dist.get_world_size(ctx.group)
        out = grad.new_empty((grad.shape[0] // n, *grad.shape[1:]))
        _reduce_scatter(out, grad.contiguous(), op=dist.ReduceOp.SUM, group=ctx.group)
        return out, None


def all_gather(x: torch.Tensor, group, dim: int = 0) -> torch.Tensor:
    """Concatenate every rank's ``x`` along ``dim`` (rank order); gradients are summed back."""
    if dim == 0:
        return _AllGather.apply(x, group)
    moved = x.movedim(dim, 0)
    return _AllGather.apply(moved, group).movedim(0, dim)


class _SumShares(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def sum_shares(x: torch.Tensor, group) -> torch.Tensor:
    """The whole of a tensor every rank holds a share of (zeros outside it), on every rank.

    Every rank then computes the same loss from the whole, so each rank's gradient is already the
    loss's gradient: the backward keeps it (no reduction) and it flows into this rank's share only.
    """
    return _SumShares.apply(x, group)
