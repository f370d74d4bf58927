"""``[parallel]`` of ``cadenza train`` checked before any process group: context parallelism's lengths."""

from __future__ import annotations

import pytest

from cadenza.errors import ConfigError
from cadenza.rl.train.ranks.sharding import check_context
from tests.support.tiny_moe import tiny_model


def test_cp_lengths_are_checked_against_the_rollout_and_the_window() -> None:
    model = tiny_model("qwen3_moe")  # max_position_embeddings = 128
    check_context(128, 2, model)  # 128 splits into 4 chunks of 32
    check_context(7, 2, model)  # padded to 8: every length splits once padded
    with pytest.raises(ConfigError, match=r"rollout.max_context_tokens = 3 is shorter; lower parallel.cp"):
        check_context(3, 2, model)
    # 127 tokens pad to 132 at cp = 3, past the window: positions there would be out of the model's range
    with pytest.raises(ConfigError, match=r"becomes 132, past the model's max_position_embeddings = 128; "
                       r"set rollout.max_context_tokens <= 126"):  # fmt: skip
        check_context(127, 3, model)


def test_cp_pairs_share_their_microbatches_in_lockstep_rounds() -> None:
    """World 8 as dp_shard = 4, cp = 2: ranks 2k and 2k+1 compute microbatch k of each round of 4; with 5
    microbatches the second round has one, and the other batches run it as a ghost."""
    from cadenza.parallel import ParallelDims
    from cadenza.rl.train.ranks.sharding import ShardedGroup

    dims = ParallelDims(cp=2, ep=8).resolve(8)
    groups = [ShardedGroup(rank=r, world=8, dims=dims) for r in range(8)]
    assert {g.per_round for g in groups} == {4} and {g.loss_scale for g in groups} == {4.0}
    plans = [g.schedule(5) for g in groups]
    assert plans[0] == plans[1] == [(0, False), (4, False)]
    assert plans[6] == plans[7] == [(3, False), (4, True)]
    assert [p[0][0] for p in plans] == [0, 0, 1, 1, 2, 2, 3, 3]
