"""The check after every vLLM weight sync: what the worker read against what the trainer sent."""

from __future__ import annotations

import pytest

from cadenza.errors import EngineError
from cadenza.rl.engines.sync_check import check_received

SENT = ["model.embed_tokens.weight", "model.layers.0.mlp.experts.0.gate_proj.weight", "model.norm.weight"]


def test_the_same_tensors_in_another_order_pass():
    check_received(SENT, {"tensors": 3, "names": sorted(SENT, reverse=True)})


def test_a_tensor_that_did_not_arrive_is_named():
    with pytest.raises(EngineError, match=r"sent 3 tensors, the engine received 2.*experts\.0\.gate_proj"):
        check_received(SENT, {"tensors": 2, "names": [SENT[0], SENT[2]]})


def test_an_extra_or_duplicated_tensor_is_named():
    with pytest.raises(EngineError, match=r"'model\.norm\.weight' was received but not sent"):
        check_received(SENT, {"tensors": 4, "names": [*SENT, SENT[2]]})


def test_a_count_only_reply_is_compared_by_count():
    check_received(SENT, {"tensors": 3})
    with pytest.raises(EngineError, match="sent 3 tensors, the engine received 1"):
        check_received(SENT, {"tensors": 1})
