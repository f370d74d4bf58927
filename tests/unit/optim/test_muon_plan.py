"""The sharded plan, checked without processes: every rank's plan built from the same global layout
must agree pairwise (what rank s sends to d is what d expects from s), own each matrix exactly once,
balance owners, and skip communication for matrices already whole on their rank."""

from __future__ import annotations

import pytest

from cadenza.optim.granularity import blocks
from cadenza.optim.layout import Layout
from cadenza.optim.plan import Entry, build_plan
from cadenza.optim.runtime import run_jobs


def _layout(shape, mesh_shape, placements, split_factors=()):
    """placements: per mesh dim, the tensor dim it shards or None (replicate); split_factors: per mesh
    dim, a _StridedShard's split factor (1: plain Shard)."""
    n = 1
    for m in mesh_shape:
        n *= m
    return Layout(
        ranks=tuple(range(n)),
        mesh_shape=tuple(mesh_shape),
        shard_dims=tuple(placements),
        shape=tuple(shape),
        split_factors=tuple(split_factors),
    )


def test_layout_boxes_follow_torch_chunk():
    import torch

    lay = _layout((5, 7), (2, 3), [1, 0])
    for r in lay.ranks:
        i, j = lay.coord_of(r)
        rows = torch.arange(5).chunk(3)[j] if j < len(torch.arange(5).chunk(3)) else torch.arange(0)
        cols = torch.arange(7).chunk(2)[i]
        box = lay.box_of(r)
        if len(rows):
            assert box[0] == (int(rows[0]), int(rows[-1]) + 1)
        else:
            assert box[0][0] == box[0][1]
        assert box[1] == (int(cols[0]), int(cols[-1]) + 1)


def _entries(mesh_shape, placements_by_param):
    ranks = list(range(_prod(mesh_shape)))
    out = []
    for shape, gran, kw, pl, *sf in placements_by_param:
        bx = blocks(shape, gran, **kw)
        out.append(
            Entry(
                shape=shape,
                layout=_layout(shape, mesh_shape, pl, *sf),
                group=(None, ranks),
                boxes=bx,
                ratios=[1.0] * len(bx),
                ns_key=("k",),
                steps=5,
            )
        )
    return out, ranks


CASES = {
    "1d_uneven": (
        (8,),
        [
            ((30, 64), "head", {"head_dim": 10}, [0]),
            ((64, 30), "head", {"head_dim": 10, "head_axis": 1}, [0]),
            ((5, 40, 64), "expert", {"split_sizes": (20, 20)}, [0]),
            ((5, 64, 20), "expert", {}, [1]),
        ],
    ),
    "hsdp": (
        (2, 4),
        [
            ((30, 64), "head", {"head_dim": 10}, [None, 0]),
            ((5, 40, 64), "expert", {"split_sizes": (20, 20)}, [None, 0]),
            ((64, 48), "matrix", {}, [None, 1]),
        ],
    ),
    # the expert mesh (dp_replicate, efsdp, ep) of parallelize(): FSDP2 over EP writes
    # (Replicate, _StridedShard(0, sf=ep), Shard(0)); 6 experts, 3 per EP rank, uneven over efsdp
    "expert_mesh": (
        (2, 2, 2),
        [
            ((6, 16, 8), "expert", {"split_sizes": (8, 8)}, [None, 0, 0], (1, 2, 1)),
            ((6, 8, 8), "expert", {}, [None, 0, 0], (1, 2, 1)),
            ((4, 12, 8), "expert", {}, [None, 1, 0]),  # FSDP on dim 1: gathered
            # 2-D weights on the same layout: heads / a matrix span several shards
            ((26, 8), "head", {"head_dim": 13}, [None, 0, 0], (1, 2, 1)),
            ((22, 8), "matrix", {}, [None, 0, 0], (1, 2, 1)),
        ],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_plans_agree_across_ranks(case):
    mesh_shape, params = CASES[case]
    entries, ranks = _entries(mesh_shape, params)
    plans = {r: build_plan(entries, rank=r, bucket_numel=2000) for r in ranks}
    n_jobs = len(plans[0])
    assert n_jobs > 1 and all(len(p) == n_jobs for p in plans.values())
    total_items = sum(len(e.boxes) for e in entries)
    assert sum(jp.items for jp in plans[0]) == total_items
    owned = {r: sum(len(jp.owned_ext) for jp in plans[r]) for r in ranks}
    assert sum(owned.values()) == total_items  # each matrix orthogonalised exactly once
    for k in range(n_jobs):
        assert len({plans[r][k].comm for r in ranks}) == 1  # all ranks agree whether to communicate
        for s in ranks:
            for d in ranks:
                assert plans[s][k].send_in_splits[d] == plans[d][k].recv_in_splits[s]
                assert plans[s][k].send_out_splits[d] == plans[d][k].recv_out_splits[s]
        # every element of every matrix arrives at its owner exactly once
        for r in ranks:
            jp = plans[r][k]
            need = sum(_prod(e) for e in jp.owned_ext)
            got = sum(jp.recv_in_splits) + sum(_prod(_ext(x[3])) for x in jp.local_in)
            assert need == got


STRIDED = [
    ((8, 4), (2, 2), [("s", 0, 2), ("S", 0)]),  # FSDP2 over EP / TP
    ((6, 5), (1, 2, 2), [("R",), ("s", 0, 2), ("S", 0)]),
    ((10, 3), (3, 2), [("s", 0, 2), ("S", 0)]),  # uneven FSDP inside each EP chunk
    ((7, 9), (2, 3), [("S", 1), ("S", 0)]),
    ((8, 6), (2, 2), [("S", 0), ("S", 0)]),
]  # two plain Shards on one dim


def _placement(spec):
    from torch.distributed.tensor.placement_types import Replicate, Shard, _StridedShard

    return {
        "R": lambda: Replicate(),
        "S": lambda d: Shard(d),
        "s": lambda d, f: _StridedShard(d, split_factor=f),
    }[spec[0]](*spec[1:])


@pytest.mark.parametrize("shape,mesh_shape,specs", STRIDED)
def test_boxes_match_dtensor_offsets(shape, mesh_shape, specs):
    """Each rank's box is where DTensor itself says the local shard starts, with its local shape."""
    import itertools

    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    placements = [_placement(s) for s in specs]
    lay = _layout(
        shape,
        mesh_shape,
        [None if s[0] == "R" else s[1] for s in specs],
        [s[2] if s[0] == "s" else 1 for s in specs],
    )
    lay.validate("w")
    for r, coord in enumerate(itertools.product(*map(range, mesh_shape))):
        local, offset = _compute_local_shape_and_global_offset(shape, mesh_shape, list(coord), placements)
        want = tuple((o, o + n) if n else None for o, n in zip(offset, local, strict=True))
        got = tuple((lo, hi) if hi > lo else None for lo, hi in lay.box_of(r))
        assert got == want, (coord, got, want)


def test_non_contiguous_shards_are_refused():
    from cadenza.errors import ConfigError

    # a _StridedShard with nothing splitting it back: rank 0 holds rows 0-1 and 4-5
    lay = _layout((8, 4), (2,), [0], [2])
    with pytest.raises(ConfigError, match="not one contiguous block"):
        lay.validate("experts.down_proj")


def test_owners_balanced_by_ns_cost():
    from cadenza.optim.newton_schulz import ns_flops

    # heads split by column while shards split rows: every matrix must be gathered, owners are free
    entries, ranks = _entries(
        (8,),
        [
            ((64, 160), "head", {"head_dim": 10, "head_axis": 1}, [0]),
            ((64, 96), "head", {"head_dim": 32, "head_axis": 1}, [0]),
        ],
    )
    load = {}
    for r in ranks:
        load[r] = sum(ns_flops(*jp.shape) * len(jp.owned_ext) for jp in build_plan(entries, rank=r))
    assert max(load.values()) - min(load.values()) <= ns_flops(64, 32)
    assert [len(build_plan(entries, rank=r)[0].owned_ext) for r in ranks] == [2] * 8


def _ext(block_sl):
    return tuple(s.stop - s.start for s in block_sl)


def _prod(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def test_whole_experts_need_no_communication():
    # experts sharded on the expert dim only: each matrix sits whole on one rank
    entries, ranks = _entries((4,), [((6, 8, 8), "expert", {}, [0])])
    for r in ranks:
        (jp,) = build_plan(entries, rank=r)
        assert not jp.comm
        assert len(jp.owned_ext) == len(jp.local_in) == [2, 2, 2, 0][r]
    # with replicas and replicate_split, replicas split the work and share results
    entries, ranks = _entries((2, 2), [((4, 8, 8), "expert", {}, [None, 0])])
    owned = [len(build_plan(entries, rank=r)[0].owned_ext) for r in ranks]
    assert owned == [1, 1, 1, 1]
    owned = [len(build_plan(entries, rank=r, replicate_split=False)[0].owned_ext) for r in ranks]
    assert owned == [2, 2, 2, 2] and not build_plan(entries, rank=0, replicate_split=False)[0].comm


class _Work:
    """A transfer: outstanding from the moment the job yields it until ``run_jobs`` waits on it."""

    def __init__(self, log, name, outstanding, peak):
        self.log, self.name, self.outstanding, self.peak = log, name, outstanding, peak
        outstanding.add(name)
        peak[0] = max(peak[0], len(outstanding))

    def wait(self):
        self.outstanding.remove(self.name)
        self.log.append(("wait", self.name))


def test_runtime_keeps_n_in_flight_in_fifo_order():
    log: list = []
    outstanding: set = set()
    peak = [0]

    def job(i):
        log.append(("send", i))
        yield _Work(log, i, outstanding, peak)
        log.append(("ns", i))
        yield _Work(log, f"{i}-back", outstanding, peak)

    stats = run_jobs((job(i) for i in range(5)), max_in_flight=2)
    assert stats.jobs == 5 and stats.transfers == 10 and not outstanding
    assert peak[0] == 2  # never one transfer too many, and the two really overlap
    # job 1's transfer is issued before job 0's compute: overlap
    assert log.index(("send", 1)) < log.index(("ns", 0))
    log[:], peak[0] = [], 0
    run_jobs((job(i) for i in range(3)), max_in_flight=1)
    assert peak[0] == 1
    serial = [e for e in log if e[0] in ("send", "ns")]
    assert serial == [("send", 0), ("ns", 0), ("send", 1), ("ns", 1), ("send", 2), ("ns", 2)]
