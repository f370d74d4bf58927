"""Resume with the real vLLM engine (CPU build): the engine samples from the checkpoint's weights.

A served engine loads ``model.path`` (the initial weights). Before the fix it was labelled with the
resumed checkpoint's version, so the trainer skipped the first sync and the first steps after a
resume sampled from the initial policy while reporting staleness 0. The runtime parity probe
(``rollout.sync_probe_tol``) runs after every sync of both runs and stops a run whose engine does not
hold the trainer's weights.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cadenza.errors import EngineError
from cadenza.rl.engines.policy import HFPolicy
from cadenza.rl.engines.sync_check import ParityProbe
from cadenza.rl.train.trainer import Trainer
from tests.support.engine_helpers import TOL, hf_logprobs, requires_vllm
from tests.support.rl_fixtures import config

pytestmark = [pytest.mark.slow, pytest.mark.serial, requires_vllm]


def _cfg(model, out, steps):
    cfg = config(model, out, steps=steps, lambda_sd=1.0)
    cfg.rollout = dataclasses.replace(
        cfg.rollout,
        engine="vllm",
        engine_timeout_s=300,
        sync_probe_tol=1e-3,
        engine_options={"max_model_len": 1024, "kv_cache_gib": 1, "port": 0},
    )
    return cfg


def test_resume_syncs_the_checkpoint_weights_before_the_first_rollout(sft_model_32, tmp_path):
    rows = Trainer(_cfg(sft_model_32, tmp_path / "run", steps=1)).train()  # checkpoint at step 1
    assert rows[-1]["step"] == 1 and not rows[-1]["skipped_update"]
    trainer = Trainer(_cfg(sft_model_32, tmp_path / "run", steps=2))
    try:
        assert trainer.step == 1
        engine = trainer._engine_at(1)  # what step 2's rollouts will sample from (the probe ran here)
        assert engine.version == 1
        seq = [*ParityProbe(trainer.tokenizer, 1.0).ids, 5, 9, 17, 3]
        got = torch.tensor(engine.engine.score([seq])[0])
        initial = hf_logprobs(HFPolicy.from_pretrained(sft_model_32), seq)
        resumed = hf_logprobs(trainer.policy, seq)
        assert float((resumed - initial).abs().max()) > 10 * TOL  # the checkpoint moved the weights
        assert float((got - resumed).abs().max()) <= TOL  # and the engine holds them, not the initial ones
        # the probe stops a run whose engine holds other weights (here: the initial ones, synced back)
        initial_model = HFPolicy.from_pretrained(sft_model_32).model
        engine.sync_weights(initial_model.named_parameters(), version=1)
        with pytest.raises(EngineError, match="differ from the trainer's"):
            trainer._check_parity(1)
    finally:
        trainer.close()
