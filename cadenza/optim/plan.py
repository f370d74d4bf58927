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

import heapq
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
    local_in: list[tuple] = field(default_factory=list)  # (entry, local_sl, pos, block_sl)
    send_in: list[tuple] = field(default_factory=list)  # (entry, local_sl)
    send_in_splits: list[int] = field(default_factory=list)
    recv_in: list[tuple] = field(default_factory=list)  # (pos, block_sl, piece_ext, n)
    recv_in_splits: list[int] = field(default_factory=list)
    local_out: list[tuple] = field(default_factory=list)  # (pos, block_sl, entry, local_sl, ratio)
    send_out: list[tuple] = field(default_factory=list)  # (pos, block_sl)
    send_out_splits: list[int] = field(default_factory=list)
    recv_out: list[tuple] = field(default_factory=list)  # (entry, local_sl, piece_ext, n, ratio)
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


def build_plan(
    entries: list[Entry], *, rank: int, bucket_numel: int = 1 << 24, replicate_split: bool = True
) -> list[JobPlan]:
    """Group matrices into jobs and compute this rank's send/receive lists for each."""
    buckets: dict[tuple, list[Item]] = {}
    for i, e in enumerate(entries):
        lkey = e.layout.key if e.layout is not None else None
        for box, ratio in zip(e.boxes, e.ratios, strict=True):
            key = (box_matrix_shape(box), e.ns_key, lkey)
            buckets.setdefault(key, []).append(Item(entry=i, box=box, ratio=ratio))
    load: dict[int, float] = defaultdict(float)
    heaps: dict = {}  # per rank set: a lazy min-heap of NS load; "gpos": group-rank lookups
    plans: list[JobPlan] = []
    for (shape, ns_key, _), items in buckets.items():
        per_job = max(1, bucket_numel // (shape[0] * shape[1]))
        for start in range(0, len(items), per_job):
            plans.append(
                _plan_job(
                    entries, items[start : start + per_job], shape, ns_key, rank, load, replicate_split, heaps
                )
            )
    return plans


def _plan_job(
    entries: list[Entry],
    items: list[Item],
    shape: tuple[int, int],
    ns_key: tuple,
    rank: int,
    load: dict[int, float],
    replicate_split: bool,
    heaps: dict,
) -> JobPlan:
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
    key = tuple(group_ranks)
    if key not in heaps.setdefault("gpos", {}):
        heaps["gpos"][key] = {r: i for i, r in enumerate(group_ranks)}
    gpos = heaps["gpos"][key]
    n = len(group_ranks)
    # by destination/source group rank; sparse, since a job touches few ranks
    send_in: dict[int, list] = defaultdict(list)
    recv_in: dict[int, list] = defaultdict(list)
    send_out: dict[int, list] = defaultdict(list)
    recv_out: dict[int, list] = defaultdict(list)
    cost = ns_flops(*shape, steps=entry0.steps)
    for it in items:
        lay = entries[it.entry].layout
        assert lay is not None
        touching = lay.touching(it.box)  # coordinates on the sharded mesh dims holding part of the matrix
        replicas = lay.replicas
        whole = len(touching) == 1
        holders = [lay.rank_at(_fill(lay, touching[0], rep)) for rep in replicas] if whole else []
        if holders and not replicate_split:
            owners = holders  # every replica holding it computes its own copy
        elif holders:
            owners = [min(holders, key=lambda r: (load[r], gpos[r]))]
        else:
            owners = [_least_loaded(heaps, lay.ranks, load, gpos)]
        n_dests = len(touching) * len(replicas)
        my = lay.coord_of(rank)
        my_box = lay.box_of(rank)
        i_touch = intersect(my_box, it.box) is not None
        for owner in owners:
            load[owner] += cost
            if owner in holders and (len(owners) > 1 or n_dests == 1):
                if owner == rank:  # whole here and needed nowhere else: no communication
                    pos = _own(jp, it.box)
                    full = rel_slices(it.box, it.box)
                    jp.local_in.append((it.entry, rel_slices(it.box, my_box), pos, full))
                    jp.local_out.append((pos, full, it.entry, rel_slices(it.box, my_box), it.ratio))
                continue
            jp.comm = True
            orow = lay.coord_of(owner)
            if owner == rank:
                pos = _own(jp, it.box)
                if owner in holders:
                    sources = {owner: it.box}
                else:  # one source per shard the matrix touches, from the owner's own replica row
                    sources = {}
                    for sub in touching:
                        src = lay.rank_at(_fill(lay, sub, tuple(orow[i] for i in lay.replicated)))
                        sources[src] = intersect(lay.box_of(src), it.box)
                for src, piece in sources.items():
                    if src == rank:
                        jp.local_in.append(
                            (it.entry, rel_slices(piece, my_box), pos, rel_slices(piece, it.box))
                        )
                    else:
                        recv_in[gpos[src]].append(
                            (pos, rel_slices(piece, it.box), extents(piece), _numel(piece))
                        )
                for c in _all_coords(lay, touching, replicas):
                    dst = lay.rank_at(c)
                    piece = intersect(lay.box_of(dst), it.box)
                    bsl = rel_slices(piece, it.box)
                    if dst == rank:
                        jp.local_out.append((pos, bsl, it.entry, rel_slices(piece, my_box), it.ratio))
                    else:
                        send_out[gpos[dst]].append((pos, bsl))
                        jp.moved_elems += _numel(piece)
                continue
            if not i_touch:
                continue
            piece = intersect(my_box, it.box)
            is_source = owner not in holders and all(my[i] == orow[i] for i in lay.replicated)
            if is_source:
                send_in[gpos[owner]].append((it.entry, rel_slices(piece, my_box)))
                jp.moved_elems += _numel(piece)
            recv_out[gpos[owner]].append(
                (it.entry, rel_slices(piece, my_box), extents(piece), _numel(piece), it.ratio)
            )
    jp.send_in, jp.send_in_splits = _flatten(send_in, n, lambda x: _numel_sl(x[1]))
    jp.recv_in, jp.recv_in_splits = _flatten(recv_in, n, lambda x: x[3])
    jp.send_out, jp.send_out_splits = _flatten(send_out, n, lambda x: _numel_sl(x[1]))
    jp.recv_out, jp.recv_out_splits = _flatten(recv_out, n, lambda x: x[3])
    return jp


def _fill(lay: Layout, sub: tuple[int, ...], rep: tuple[int, ...]) -> tuple[int, ...]:
    """The mesh coordinate with ``sub`` on the sharded mesh dims and ``rep`` on the replicated ones."""
    out = [0] * len(lay.mesh_shape)
    for i, c in zip(lay.sharded, sub, strict=True):
        out[i] = c
    for i, c in zip(lay.replicated, rep, strict=True):
        out[i] = c
    return tuple(out)


def _all_coords(lay: Layout, touching: list[tuple[int, ...]], replicas: list[tuple[int, ...]]):
    return (_fill(lay, sub, rep) for sub in touching for rep in replicas)


def _flatten(by_rank: dict[int, list], n: int, size) -> tuple[list, list[int]]:
    """Pieces in group-rank order and the element count per group rank (the all_to_all splits)."""
    splits = [0] * n
    flat: list = []
    for k in sorted(by_rank):
        flat.extend(by_rank[k])
        splits[k] = sum(size(x) for x in by_rank[k])
    return flat, splits


def _own(jp: JobPlan, box: Box) -> int:
    jp.owned_ext.append(extents(box))
    return len(jp.owned_ext) - 1


def _least_loaded(heaps: dict, ranks: tuple[int, ...], load: dict[int, float], gpos: dict[int, int]) -> int:
    """The rank of ``ranks`` with the least NS load (ties: lowest group rank), via a lazily updated heap."""
    heap = heaps.get(ranks)
    if heap is None:
        heap = heaps[ranks] = [(load[r], gpos[r], r) for r in ranks]
        heapq.heapify(heap)
    while True:
        cur, g, r = heapq.heappop(heap)
        if cur == load[r]:
            heapq.heappush(heap, (load[r], g, r))  # caller adds the cost; the stale entry is refreshed later
            return r
        heapq.heappush(heap, (load[r], g, r))


def _numel_sl(sl: tuple[slice, ...]) -> int:
    n = 1
    for s in sl:
        n *= s.stop - s.start
    return n


def comm_dtype(param_dtype: torch.dtype, ns_dtype: torch.dtype) -> torch.dtype:
    """Send in the NS dtype when it is narrower: the first thing NS does is cast, so nothing is lost."""
    return ns_dtype if ns_dtype.itemsize < param_dtype.itemsize else param_dtype
