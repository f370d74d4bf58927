"""Where each rank's shard of a (possibly DTensor) parameter sits inside the full parameter.

What FSDP2, HSDP and expert parallelism produce is accepted: ``Shard(d)``, ``_StridedShard(d)`` (FSDP2
over an EP-sharded DTensor) and ``Replicate()`` placements on a 1-D or N-D mesh, as long as every rank's
shard is one box of the full tensor. Shards follow DTensor's own definition (``torch.chunk``: ceil-sized,
trailing ranks may be short or empty), so the box is exact for uneven dims too.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import Replicate, Shard, _StridedShard  # FSDP2 over EP/TP

from cadenza.errors import ConfigError
from cadenza.optim.granularity import Box


def is_dtensor(t: torch.Tensor) -> bool:
    return isinstance(t, DTensor)


def local(t: torch.Tensor) -> torch.Tensor:
    """The local shard (an alias: in-place ops on it change the DTensor)."""
    return t.to_local() if is_dtensor(t) else t


def _placements(p: torch.Tensor, name: str) -> tuple[tuple[int | None, ...], tuple[int, ...]]:
    """Per mesh dim: the tensor dim it shards (None: replicated) and its split factor (1: plain Shard)."""
    dims: list[int | None] = []
    factors: list[int] = []
    for pl in p.placements:
        if type(pl) in (Shard, _StridedShard):
            dims.append(pl.dim % p.ndim)
            factors.append(int(getattr(pl, "split_factor", 1)))
        elif type(pl) is Replicate:
            dims.append(None)
            factors.append(1)
        else:
            raise ConfigError(
                f"{name}: unsupported DTensor placement {pl!r} in {p.placements}; Muon supports "
                "Shard(d), _StridedShard(d) and Replicate() (FSDP2 / HSDP / EP); redistribute the "
                "parameter first"
            )
    return tuple(dims), tuple(factors)


def check_layout(p: torch.Tensor, name: str) -> None:
    """Raise ConfigError for a DTensor layout the sharded Muon path cannot gather exactly: a placement
    other than Shard / _StridedShard / Replicate, or shards that are not one box of the full tensor."""
    if not is_dtensor(p):
        return
    lay = layout_of(p, name)
    assert lay is not None
    lay.validate(name, str(p.placements))


def _chunk(start: int, length: int, parts: int, index: int) -> tuple[int, int]:
    size = -(-length // parts) if length else 0
    lo = min(index * size, length)
    return start + lo, start + min(lo + size, length)


Runs = list[tuple[int, int]]


def _take(runs: Runs, a: int, b: int) -> Runs:
    """Positions ``[a, b)`` of the index sequence that ``runs`` (half-open ranges) concatenate to."""
    out, pos = [], 0
    for lo, hi in runs:
        s, e = max(a, pos), min(b, pos + hi - lo)
        if s < e:
            out.append((lo + s - pos, lo + e - pos))
        pos += hi - lo
    return out


def _merge(runs: Runs) -> Runs:
    out: Runs = []
    for lo, hi in runs:
        if out and out[-1][1] == lo:
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def _split(runs: Runs, parts: int, index: int, split_factor: int) -> Runs:
    """Piece ``index`` of ``parts`` of an index sequence, as DTensor defines it: ``Shard`` is
    ``torch.chunk``; ``_StridedShard(split_factor=f)`` chunks into ``f`` pieces first, takes piece
    ``index`` of each and concatenates them (the right-to-left sharding FSDP2 does over EP/TP)."""
    total = sum(hi - lo for lo, hi in runs)
    out: Runs = []
    for k in range(split_factor):
        part = _take(runs, *_chunk(0, total, split_factor, k))
        out.extend(_take(part, *_chunk(0, sum(hi - lo for lo, hi in part), parts, index)))
    return _merge(out)


@dataclass(frozen=True)
class Layout:
    """A parameter's mesh (global ranks, row-major over ``mesh_shape``), which tensor dim each mesh
    dim shards (None: replicated) and, for ``_StridedShard``, its split factor. Several mesh dims may
    shard one tensor dim (EP then FSDP on the expert dim) as long as every shard is contiguous. Boxes and
    overlaps are computed arithmetically, so planning costs O(pieces), not O(matrices x ranks)."""

    ranks: tuple[int, ...]
    mesh_shape: tuple[int, ...]
    shard_dims: tuple[int | None, ...]
    shape: tuple[int, ...]
    split_factors: tuple[int, ...] = ()  # per mesh dim; empty: all 1 (plain Shard)

    @property
    def key(self) -> tuple:
        return (self.ranks, self.mesh_shape)

    @cached_property
    def sharded(self) -> tuple[int, ...]:
        """Mesh dims that shard some tensor dim, in mesh order."""
        return tuple(i for i, d in enumerate(self.shard_dims) if d is not None)

    @cached_property
    def replicated(self) -> tuple[int, ...]:
        return tuple(i for i, d in enumerate(self.shard_dims) if d is None)

    @cached_property
    def replicas(self) -> list[tuple[int, ...]]:
        """Every coordinate on the :attr:`replicated` mesh dims."""
        return list(itertools.product(*(range(self.mesh_shape[i]) for i in self.replicated)))

    def validate(self, name: str, placements: str = "") -> None:
        """Raise ConfigError unless every rank's shard is one contiguous block of each tensor dim."""
        for d in range(len(self.shape)):
            for sub, runs in self.runs(d).items():
                if len(runs) > 1:
                    raise ConfigError(
                        f"{name}: with placements {placements or self.shard_dims} on mesh "
                        f"{list(self.mesh_shape)}, "
                        f"the shard at mesh coordinates {sub} holds ranges {runs} of tensor dim {d}, not one "
                        "contiguous block; Muon needs every shard to be a box of the full tensor (FSDP2 "
                        "/ HSDP / "
                        "EP layouts); redistribute the parameter first"
                    )

    def _factor(self, i: int) -> int:
        return self.split_factors[i] if self.split_factors else 1

    def _mesh_dims_of(self, d: int) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.shard_dims) if t == d)

    def _simple(self, d: int) -> bool:
        dims = self._mesh_dims_of(d)
        return len(dims) == 1 and self._factor(dims[0]) == 1

    def runs(self, d: int) -> dict[tuple[int, ...], Runs]:
        """For every coordinate on the mesh dims sharding tensor dim ``d``, the index runs it holds."""
        cache = self.__dict__.setdefault("_runs", {})
        if d not in cache:
            dims = self._mesh_dims_of(d)
            out = {}
            for sub in itertools.product(*(range(self.mesh_shape[i]) for i in dims)):
                runs: Runs = [(0, self.shape[d])] if self.shape[d] else []
                for i, c in zip(dims, sub, strict=True):
                    runs = _split(runs, self.mesh_shape[i], c, self._factor(i))
                out[sub] = runs
            cache[d] = out
        return cache[d]

    def _interval(self, d: int, sub: tuple[int, ...]) -> tuple[int, int]:
        if self._simple(d):
            return _chunk(0, self.shape[d], self.mesh_shape[self._mesh_dims_of(d)[0]], sub[0])
        runs = self.runs(d)[sub]
        if len(runs) > 1:
            raise ConfigError(f"shard {sub} of tensor dim {d} is not contiguous ({runs}); see check_layout")
        return runs[0] if runs else (0, 0)

    @cached_property
    def _coords(self) -> dict[int, tuple[int, ...]]:
        return {
            r: c for r, c in zip(self.ranks, itertools.product(*map(range, self.mesh_shape)), strict=True)
        }

    def coord_of(self, rank: int) -> tuple[int, ...]:
        return self._coords[rank]

    def rank_at(self, coord: Sequence[int]) -> int:
        flat = 0
        for c, s in zip(coord, self.mesh_shape, strict=True):
            flat = flat * s + c
        return self.ranks[flat]

    def box_of(self, rank: int) -> Box:
        coord = self.coord_of(rank)
        box = [(0, n) for n in self.shape]
        for d in {t for t in self.shard_dims if t is not None}:
            box[d] = self._interval(d, tuple(coord[i] for i in self._mesh_dims_of(d)))
        return tuple(box)

    @cached_property
    def boxes(self) -> dict[int, Box]:
        return {r: self.box_of(r) for r in self.ranks}

    def _sorted_intervals(self, d: int) -> tuple[list[int], list[tuple[int, int, tuple[int, ...]]]]:
        """Non-empty shard intervals of tensor dim ``d`` by start (the mesh dims sharding it partition it)."""
        cache = self.__dict__.setdefault("_sorted", {})
        if d not in cache:
            spans = sorted((*self._interval(d, s), s) for s in self.runs(d))
            spans = [x for x in spans if x[1] > x[0]]
            cache[d] = ([x[0] for x in spans], spans)
        return cache[d]

    def touching(self, box: Box) -> list[tuple[int, ...]]:
        """Coordinates on the :attr:`sharded` mesh dims whose shard intersects ``box``."""
        per_dim: list[tuple[tuple[int, ...], list[tuple[int, ...]]]] = []
        for d in sorted({t for t in self.shard_dims if t is not None}):
            lo, hi = box[d]
            dims = self._mesh_dims_of(d)
            if self._simple(d):
                size = -(-self.shape[d] // self.mesh_shape[dims[0]])
                subs = [(c,) for c in range(lo // size, (hi - 1) // size + 1)]
            else:
                starts, spans = self._sorted_intervals(d)
                i = max(bisect.bisect_right(starts, lo) - 1, 0)
                subs = []
                while i < len(spans) and spans[i][0] < hi:
                    if spans[i][1] > lo:
                        subs.append(spans[i][2])
                    i += 1
            per_dim.append((dims, subs))
        out = []
        for combo in itertools.product(*(subs for _, subs in per_dim)):
            coord = dict(
                zip((i for dims, _ in per_dim for i in dims), (c for sub in combo for c in sub), strict=True)
            )
            out.append(tuple(coord[i] for i in self.sharded))
        return out


def layout_of(p: torch.Tensor, name: str = "parameter") -> Layout | None:
    """None for a plain tensor (whole on this rank); else its mesh and sharded dims."""
    if not is_dtensor(p):
        return None
    grid = p.device_mesh.mesh
    dims, factors = _placements(p, name)
    return Layout(
        ranks=tuple(grid.flatten().tolist()),
        mesh_shape=tuple(grid.shape),
        shard_dims=dims,
        shape=tuple(p.shape),
        split_factors=factors if any(f != 1 for f in factors) else (),
    )


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
