"""The stream a sharded trainer syncs engines from (``gpu_sync.ShardStream``), on 2 gloo ranks with EP 2.

Rank 0 reads it through the engine's buckets while rank 1 drains it: rank 0 receives every tensor under
the engine's names, equal to the unsharded model's, and never more than one bucket at a time. When rank
0's engine fails half-way, rank 0 drains the rest (the collectives match) and the error reaches rank 1
through ``share_from_rank0`` instead of leaving it waiting in a gather.
"""

from __future__ import annotations

from cadenza.testing import spawn
from tests.support.tiny_moe import PRELOAD


def _run(rank: int, world: int) -> dict:
    import torch

    from cadenza.errors import EngineError
    from cadenza.parallel import ParallelDims, parallelize
    from cadenza.parallel.launch import share_from_rank0
    from cadenza.rl.engines.gpu_sync import ShardStream
    from cadenza.rl.engines.weights import buckets, engine_names
    from tests.support.tiny_moe import tiny_model

    torch.set_num_threads(1)
    model = tiny_model("qwen3_moe")
    want = {n: t.detach().clone() for n, t in engine_names(model.named_parameters())}
    parallelize(model, ParallelDims(ep=world).resolve(world))
    stream = ShardStream(model)
    sizes, got = [], {}
    if rank:
        stream.drain()
    else:
        for bucket in buckets(stream, bucket_bytes=1 << 14):
            sizes.append(sum(t.numel() * t.element_size() for _, t in bucket))
            got.update((n, t.clone()) for n, t in bucket)
    exact = rank != 0 or (got.keys() == want.keys() and all(torch.equal(got[n], want[n]) for n in want))

    failing = ShardStream(model)

    def feed() -> None:  # rank 0's engine dies after three tensors
        try:
            for i, _ in enumerate(failing):
                if i == 3:
                    raise EngineError("engine 'vllm' died during the sync")
        finally:
            failing.drain()

    if rank:
        failing.drain()
    try:
        share_from_rank0(feed)
        error = None
    except EngineError as exc:
        error = str(exc)
    return {"exact": exact, "gathered": (stream.gathered, failing.gathered), "error": error, "sizes": sizes,
            "largest": max(t.numel() * t.element_size() for t in want.values())}  # fmt: skip


def test_rank_0_feeds_the_buckets_and_a_failure_reaches_every_rank():
    results = spawn(_run, 2, preload=PRELOAD)
    assert all(r["exact"] for r in results)
    assert results[0]["gathered"] == results[1]["gathered"]  # the same collectives on both ranks
    assert results[0]["gathered"][0] == results[0]["gathered"][1]  # drained to the end after the failure
    assert all(r["error"] == "engine 'vllm' died during the sync" for r in results)
    # a bucket exceeds bucket_bytes only when one tensor alone does
    assert all(size <= max(1 << 14, results[0]["largest"]) for size in results[0]["sizes"])
    assert len(results[0]["sizes"]) > 3
