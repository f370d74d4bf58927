"""Where each rank's shard of a (possibly DTensor) parameter sits inside the full parameter.

Only what FSDP2 produces is accepted: ``Shard(d)`` and ``Replicate()`` placements, at most one ``Shard``
per tensor dim, on a 1-D or N-D mesh (HSDP). Shards follow ``torch.chunk`` (ceil-sized, trailing ranks
may be short or empty), which is how DTensor splits uneven dims.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from cadenza.errors import ConfigError
from cadenza.optim.granularity import Box

try:
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import Replicate, Shard
except ImportError:  # pragma: no cover - torch without DTensor
    DTensor = None  # type: ignore[assignment,misc]


def is_dtensor(t: torch.Tensor) -> bool:
    return DTensor is not None and isinstance(t, DTensor)


def local(t: torch.Tensor) -> torch.Tensor:
    """The local shard (an alias: in-place ops on it change the DTensor)."""
    return t.to_local() if is_dtensor(t) else t


def check_layout(p: torch.Tensor, name: str) -> None:
    """Raise ConfigError for a DTensor layout the sharded Muon path cannot gather exactly."""
    if not is_dtensor(p):
        return
    seen: set[int] = set()
    for pl in p.placements:
        if type(pl) is Shard:
            d = pl.dim % p.ndim
            if d in seen:
                raise ConfigError(f"{name}: two mesh dims shard tensor dim {d} ({p.placements}); Muon supports one "
                                  "Shard per tensor dim (FSDP2 / HSDP layouts)")
            seen.add(d)
        elif type(pl) is not Replicate:
            raise ConfigError(f"{name}: unsupported DTensor placement {pl!r} in {p.placements}; Muon supports "
                              "Shard(d) and Replicate() (FSDP2 / HSDP); redistribute the parameter first")


def _chunk(start: int, length: int, parts: int, index: int) -> tuple[int, int]:
    size = -(-length // parts) if length else 0
    lo = min(index * size, length)
    return start + lo, start + min(lo + size, length)


@dataclass(frozen=True)
class Layout:
    """The mesh (as global ranks, row-major) and every rank's box of the full parameter."""

    ranks: tuple[int, ...]
    mesh_shape: tuple[int, ...]
    boxes: dict[int, Box]

    @property
    def key(self) -> tuple:
        return (self.ranks, self.mesh_shape)


def layout_of(p: torch.Tensor) -> Layout | None:
    """None for a plain tensor (whole on this rank); else each mesh rank's box."""
    if not is_dtensor(p):
        return None
    mesh = p.device_mesh
    grid = mesh.mesh
    shape = tuple(p.shape)
    boxes: dict[int, Box] = {}
    for coord in torch.cartesian_prod(*[torch.arange(s) for s in grid.shape]).reshape(-1, grid.ndim).tolist():
        box = [(0, n) for n in shape]
        for i, pl in enumerate(p.placements):
            if type(pl) is Shard:
                d = pl.dim % len(shape)
                box[d] = _chunk(box[d][0], box[d][1] - box[d][0], grid.shape[i], coord[i])
        boxes[int(grid[tuple(coord)])] = tuple(box)
    return Layout(ranks=tuple(grid.flatten().tolist()), mesh_shape=tuple(grid.shape), boxes=boxes)


def intersect(a: Box, b: Box) -> Box | None:
    out = tuple((max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b, strict=True))
    return None if any(lo >= hi for lo, hi in out) else out


def contains(outer: Box, inner: Box) -> bool:
    return all(o0 <= i0 and i1 <= o1 for (o0, o1), (i0, i1) in zip(outer, inner, strict=True))


def rel_slices(box: Box, origin: Box) -> tuple[slice, ...]:
    return tuple(slice(lo - o, hi - o) for (lo, hi), (o, _) in zip(box, origin, strict=True))


def extents(box: Box) -> tuple[int, ...]:
    return tuple(hi - lo for lo, hi in box)


_GROUPS: dict[tuple, tuple[dist.ProcessGroup, list[int]]] = {}


def comm_group(p: torch.Tensor) -> tuple[dist.ProcessGroup, list[int]]:
    """A process group over all ranks of ``p``'s mesh and its global ranks in group-rank order."""
    mesh = p.device_mesh
    if mesh.ndim == 1:
        group = mesh.get_group()
        return group, dist.get_process_group_ranks(group)
    ranks = tuple(sorted(mesh.mesh.flatten().tolist()))
    key = (id(dist.distributed_c10d._get_default_group()), *ranks)
    if key not in _GROUPS:
        group = dist.new_group(list(ranks), use_local_synchronization=True)
        _GROUPS[key] = (group, dist.get_process_group_ranks(group))
    return _GROUPS[key]
