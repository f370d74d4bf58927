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


def test_the_trainer_streams_module_weights_that_the_native_transfer_needs(tmp_path):
    """The seam of vLLM's NCCL / CUDA-IPC transfer: `cadenza train` hands every engine a ModuleWeights
    (metadata first, then the stream), not a plain generator that `_sync_native` would refuse."""
    from cadenza.rl.config import EnvConfig, ModelConfig, RunConfig, TrainConfig
    from cadenza.rl.engines.gpu_sync import ModuleWeights
    from cadenza.rl.engines.hf import WeightTable
    from cadenza.rl.train.trainer import Trainer
    from tests.support.rl_helpers import make_tokenizer

    make_tokenizer().save_pretrained(str(tmp_path / "tok"))
    cfg = TrainConfig(
        run=RunConfig(out_dir=str(tmp_path / "run"), steps=1, progress=False),
        model=ModelConfig(tokenizer=str(tmp_path / "tok"), arch="qwen3_moe", num_experts=4),
        env=EnvConfig(name="toolworld"),
    )
    cfg.probe.every = 0
    trainer = Trainer(cfg, resume=False)
    weights = trainer._weights()
    assert isinstance(weights, ModuleWeights)
    names = [name for name, _ in weights]
    assert [n for n, _, _ in weights.metadata()] == names  # declared as streamed (experts split per expert)
    WeightTable(trainer.model).load(weights)  # and the hf engine's loader takes the same stream
    trainer.close()
