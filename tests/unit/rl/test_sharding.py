"""``[parallel]`` of ``cadenza train`` checked before any process group: context parallelism's lengths."""

from __future__ import annotations

import pytest

from cadenza.errors import ConfigError
from cadenza.rl.train.sharding import check_context
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
