"""Plan one Muon step: which rank orthogonalises each matrix and which pieces travel where.

Every rank builds the same global plan from shapes and layouts alone (no communication), then keeps
its own part: the slices it sends in the gather ``all_to_all_single``, the slices it receives into the
matrices it owns, and the mirror image for returning the results. Pieces are exact intersections of a
matrix's box with each rank's shard box, so uneven shards, empty shards, Shard(0) or Shard(1), 1-D or
HSDP meshes need no padding (``all_to_all_single`` takes unequal splits).

Owners: a matrix whole on some ranks is owned by one of them (no gather; with ``replicate_split``
replicas split such matrices and share results, else each replica computes its own copy); otherwise
by the least-loaded mesh rank, load being accumulated Newton–Schulz FLOPs. Sources: for each distinct
shard box the matrix touches, the replica in the owner's own replica row, so gather traffic is spread
over replicas.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from cadenza.optim.granularity import Box, box_matrix_shape
from cadenza.optim.layout import Layout, extents, intersect, rel_slices
from cadenza.optim.newton_schulz import ns_flops


@dataclass(frozen=True)
class Item:
    """One matrix: block ``box`` of step-entry ``entry``; ``ratio`` is its adjusted-lr factor."""

    entry: int
    box: Box
    ratio: float


@dataclass(kw_only=True)
class JobPlan:
    """This rank's part of one job (same matrix shape, NS settings and mesh)."""

    shape: tuple[int, int]
    ns_key: tuple
    group: dist.ProcessGroup | None = None
    comm: bool = False
    owned_ext: list[tuple[int, ...]] = field(default_factory=list)
    local_in: list[tuple] = field(default_factory=list)    # (entry, local_sl, pos, block_sl)
    send_in: list[tuple] = field(default_factory=list)     # (entry, local_sl)
    send_in_splits: list[int] = field(default_factory=list)
    recv_in: list[tuple] = field(default_factory=list)     # (pos, block_sl, piece_ext, n)
    recv_in_splits: list[int] = field(default_factory=list)
    local_out: list[tuple] = field(default_factory=list)   # (pos, block_sl, entry, local_sl, ratio)
    send_out: list[tuple] = field(default_factory=list)    # (pos, block_sl)
    send_out_splits: list[int] = field(default_factory=list)
    recv_out: list[tuple] = field(default_factory=list)    # (entry, local_sl, piece_ext, n, ratio)
    recv_out_splits: list[int] = field(default_factory=list)
    items: int = 0
    moved_elems: int = 0  # elements this rank sends (both directions)


@dataclass(kw_only=True)
class Entry:
    """A parameter taking part in this step: its full shape, layout, blocks and NS settings."""

    shape: tuple[int, ...]
    layout: Layout | None
    group: tuple[dist.ProcessGroup, list[int]] | None
    boxes: list[Box]
    ratios: list[float]
    ns_key: tuple
    steps: int


def _numel(box: Box) -> int:
    n = 1
    for e in extents(box):
        n *= e
    return n


def build_plan(entries: list[Entry], *, rank: int, bucket_numel: int = 1 << 24,
               replicate_split: bool = True) -> list[JobPlan]:
    """Group matrices into jobs and compute this rank's send/receive lists for each."""
    buckets: dict[tuple, list[Item]] = {}
    for i, e in enumerate(entries):
        lkey = e.layout.key if e.layout is not None else None
        for box, ratio in zip(e.boxes, e.ratios, strict=True):
            key = (box_matrix_shape(box), e.ns_key, lkey)
            buckets.setdefault(key, []).append(Item(entry=i, box=box, ratio=ratio))
    load: dict[int, float] = defaultdict(float)
    plans: list[JobPlan] = []
    for (shape, ns_key, _), items in buckets.items():
        per_job = max(1, bucket_numel // (shape[0] * shape[1]))
        for start in range(0, len(items), per_job):
            plans.append(_plan_job(entries, items[start:start + per_job], shape, ns_key, rank, load,
                                   replicate_split))
    return plans


def _plan_job(entries: list[Entry], items: list[Item], shape: tuple[int, int], ns_key: tuple, rank: int,
              load: dict[int, float], replicate_split: bool) -> JobPlan:
    entry0 = entries[items[0].entry]
    jp = JobPlan(shape=shape, ns_key=ns_key, items=len(items))
    if entry0.layout is None:  # plain tensors: whole on this rank, no communication
        for it in items:
            pos = len(jp.owned_ext)
            jp.owned_ext.append(extents(it.box))
            sl = rel_slices(it.box, it.box)
            full = tuple((0, n) for n in entries[it.entry].shape)
            jp.local_in.append((it.entry, rel_slices(it.box, full), pos, sl))
            jp.local_out.append((pos, sl, it.entry, rel_slices(it.box, full), it.ratio))
        return jp
    group, group_ranks = entry0.group  # type: ignore[misc]
    jp.group = group
    gpos = {r: i for i, r in enumerate(group_ranks)}
    n = len(group_ranks)
    send_in: list[list] = [[] for _ in range(n)]
    recv_in: list[list] = [[] for _ in range(n)]
    send_out: list[list] = [[] for _ in range(n)]
    recv_out: list[list] = [[] for _ in range(n)]
    cost = ns_flops(*shape, steps=entry0.steps)
    for it in items:
        lay = entries[it.entry].layout
        assert lay is not None
        overlap = lay.overlapping(it.box)
        sharded = [i for i, d in enumerate(lay.shard_dims) if d is not None]
        whole = all(len(overlap[i]) == 1 for i in sharded)
        holders = [lay.rank_at(c) for c in itertools.product(*overlap)] if whole else []
        if holders and not replicate_split:
            owners = holders  # every replica holding it computes its own copy
        else:
            owners = [min(holders or lay.ranks, key=lambda r: (load[r], gpos[r]))]
        for owner in owners:
            load[owner] += cost
            sources: dict[int, Box] = {}
            if owner in holders:
                sources[owner] = it.box
            else:  # one source per shard the matrix touches, from the owner's own replica row
                row = list(lay.coord_of(owner))
                for combo in itertools.product(*[overlap[i] for i in sharded]):
                    for i, c in zip(sharded, combo, strict=True):
                        row[i] = c
                    src = lay.rank_at(row)
                    sources[src] = intersect(lay.box_of(src), it.box)  # type: ignore[assignment]
            if len(owners) > 1:
                dests = {owner: it.box}
            else:
                dests = {r: intersect(lay.box_of(r), it.box) for r in
                         (lay.rank_at(c) for c in itertools.product(*overlap))}  # type: ignore[misc]
            if any(r != owner for r in (*sources, *dests)):
                jp.comm = True
            my_box = lay.box_of(rank)
            pos = None
            if owner == rank:
                pos = len(jp.owned_ext)
                jp.owned_ext.append(extents(it.box))
            for src, piece in sources.items():
                psl, bsl = rel_slices(piece, my_box), rel_slices(piece, it.box)
                if src == rank and owner == rank:
                    jp.local_in.append((it.entry, psl, pos, bsl))
                elif src == rank:
                    send_in[gpos[owner]].append((it.entry, psl))
                    jp.moved_elems += _numel(piece)
                elif owner == rank:
                    recv_in[gpos[src]].append((pos, bsl, extents(piece), _numel(piece)))
            for dst, piece in dests.items():
                bsl = rel_slices(piece, it.box)
                if dst == rank and owner == rank:
                    jp.local_out.append((pos, bsl, it.entry, rel_slices(piece, my_box), it.ratio))
                elif owner == rank:
                    send_out[gpos[dst]].append((pos, bsl))
                    jp.moved_elems += _numel(piece)
                elif dst == rank:
                    recv_out[gpos[owner]].append((it.entry, rel_slices(piece, my_box), extents(piece),
                                                  _numel(piece), it.ratio))
    jp.send_in = [x for lst in send_in for x in lst]
    jp.send_in_splits = [sum(_numel_sl(sl) for _, sl in lst) for lst in send_in]
    jp.recv_in = [x for lst in recv_in for x in lst]
    jp.recv_in_splits = [sum(x[3] for x in lst) for lst in recv_in]
    jp.send_out = [x for lst in send_out for x in lst]
    jp.send_out_splits = [sum(_numel_sl(bsl) for _, bsl in lst) for lst in send_out]
    jp.recv_out = [x for lst in recv_out for x in lst]
    jp.recv_out_splits = [sum(x[3] for x in lst) for lst in recv_out]
    return jp


def _numel_sl(sl: tuple[slice, ...]) -> int:
    n = 1
    for s in sl:
        n *= s.stop - s.start
    return n


def comm_dtype(param_dtype: torch.dtype, ns_dtype: torch.dtype) -> torch.dtype:
    """Send in the NS dtype when it is narrower: the first thing NS does is cast, so nothing is lost."""
    return ns_dtype if ns_dtype.itemsize < param_dtype.itemsize else param_dtype
