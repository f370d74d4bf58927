"""Where each rank's shard of a (possibly DTensor) parameter sits inside the full parameter.

Only what FSDP2 produces is accepted: ``Shard(d)`` and ``Replicate()`` placements, at most one ``Shard``
per tensor dim, on a 1-D or N-D mesh (HSDP). Shards follow ``torch.chunk`` (ceil-sized, trailing ranks
may be short or empty), which is how DTensor splits uneven dims.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

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
    """A parameter's mesh (global ranks, row-major over ``mesh_shape``) and which tensor dim each mesh
    dim shards (None: replicated). Boxes and overlaps are computed arithmetically, so planning costs
    O(pieces), not O(matrices x ranks)."""

    ranks: tuple[int, ...]
    mesh_shape: tuple[int, ...]
    shard_dims: tuple[int | None, ...]
    shape: tuple[int, ...]

    @property
    def key(self) -> tuple:
        return (self.ranks, self.mesh_shape)

    @cached_property
    def _coords(self) -> dict[int, tuple[int, ...]]:
        return {r: c for r, c in zip(self.ranks, itertools.product(*map(range, self.mesh_shape)), strict=True)}

    def coord_of(self, rank: int) -> tuple[int, ...]:
        return self._coords[rank]

    def rank_at(self, coord: Sequence[int]) -> int:
        flat = 0
        for c, s in zip(coord, self.mesh_shape, strict=True):
            flat = flat * s + c
        return self.ranks[flat]

    def box_of(self, rank: int) -> Box:
        box = [(0, n) for n in self.shape]
        for i, (d, c) in enumerate(zip(self.shard_dims, self.coord_of(rank), strict=True)):
            if d is not None:
                box[d] = _chunk(0, self.shape[d], self.mesh_shape[i], c)
        return tuple(box)

    @cached_property
    def boxes(self) -> dict[int, Box]:
        return {r: self.box_of(r) for r in self.ranks}

    def overlapping(self, box: Box) -> list[list[int]]:
        """Per mesh dim, the coordinates whose shard intersects ``box`` (all, on a replicated dim)."""
        out = []
        for i, d in enumerate(self.shard_dims):
            if d is None:
                out.append(list(range(self.mesh_shape[i])))
                continue
            size = -(-self.shape[d] // self.mesh_shape[i])
            lo, hi = box[d]
            out.append(list(range(lo // size, (hi - 1) // size + 1)))
        return out


def layout_of(p: torch.Tensor) -> Layout | None:
    """None for a plain tensor (whole on this rank); else its mesh and sharded dims."""
    if not is_dtensor(p):
        return None
    grid = p.device_mesh.mesh
    dims = tuple(pl.dim % p.ndim if type(pl) is Shard else None for pl in p.placements)
    return Layout(ranks=tuple(grid.flatten().tolist()), mesh_shape=tuple(grid.shape), shard_dims=dims,
                  shape=tuple(p.shape))


def intersect(a: Box, b: Box) -> Box | None:
    out = tuple((max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b, strict=True))
    return None if any(lo >= hi for lo, hi in out) else out


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
