"""``cadenza train`` with the real vLLM engine (CPU build): synchronous and asynchronous (K = 1) runs end
to end, the engine synced after every update, the staleness schedule kept, no engine process left."""

from __future__ import annotations

import dataclasses

import pytest

from cadenza.rl.engines.policy import HFPolicy
from cadenza.rl.train.trainer import Trainer
from tests.support.engine_helpers import engine_processes as _engine_processes
from tests.support.engine_helpers import free_port as _free_port
from tests.support.engine_helpers import requires_vllm
from tests.support.rl_fixtures import config

pytestmark = [pytest.mark.slow, pytest.mark.serial, requires_vllm]


@pytest.mark.parametrize("k", [0, 1])
def test_train_with_the_vllm_engine(sft_model_32, tmp_path, k):
    port = _free_port()
    cfg = config(sft_model_32, tmp_path / "run", steps=3, lambda_sd=1.0)
    cfg.rollout = dataclasses.replace(
        cfg.rollout,
        engine="vllm",
        max_staleness=k,
        engine_timeout_s=300,
        engine_options={"max_model_len": 1024, "kv_cache_gib": 1, "port": port},
    )
    rows = Trainer(cfg).train()
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["sync_s"] > 0 for r in rows)  # the engine took new weights after every update
    assert [r["staleness_max"] for r in rows] == [min(s - 1, k) for s in (1, 2, 3)]
    assert all(r["mismatch_kl"] > -1e-6 and r["episodes"] > 0 for r in rows)  # k3 >= 0 up to rounding
    if k == 0:  # same weights on both sides: engine and trainer log-probs agree (fp32 engine)
        assert max(r["mismatch_kl"] for r in rows) < 1e-3
    assert (tmp_path / "run" / "engine.log").is_file()
    assert _engine_processes(port) == []  # the engine did not outlive the run


def test_k0_losses_on_vllm_samples_equal_the_hf_engine_path(sft_model_32, tmp_path):
    """The same vLLM-sampled episodes give the same update through the vLLM trainer (truncated IS on the
    engine's log-probs, ratios ~1 at K = 0) as through the hf-engine trainer (no IS): the losses agree and
    the updated weights agree, so K = 0 with vLLM is the synchronous algorithm, not an approximation of it."""
    import copy

    import torch

    cfg_v = config(sft_model_32, tmp_path / "v", steps=1, lambda_sd=1.0)
    cfg_v.rollout = dataclasses.replace(
        cfg_v.rollout, engine="vllm", engine_timeout_s=300, engine_options={"max_model_len": 1024}
    )
    trainer_v = Trainer(cfg_v)
    try:
        episodes, _ = trainer_v._rollouts(1)
    finally:
        trainer_v.close()
    trainer_h = Trainer(config(sft_model_32, tmp_path / "h", steps=1, lambda_sd=1.0))
    assert trainer_v.learner.off_policy and not trainer_h.learner.off_policy
    upd_v = trainer_v.learner.update(copy.deepcopy(episodes), step=1)
    upd_h = trainer_h.learner.update(copy.deepcopy(episodes), step=1)
    assert upd_v.grpo_loss == pytest.approx(upd_h.grpo_loss, abs=1e-6)
    assert upd_v.sd_loss == pytest.approx(upd_h.sd_loss, abs=1e-6) and upd_v.sd_tokens == upd_h.sd_tokens
    assert upd_v.is_truncated == 0.0
    for (name, a), (_, b) in zip(
        trainer_v.model.named_parameters(), trainer_h.model.named_parameters(), strict=True
    ):
        assert torch.allclose(a, b, atol=1e-6), name
    initial = HFPolicy.from_pretrained(sft_model_32).model.parameters()
    assert any(
        not torch.equal(a, b) for a, b in zip(trainer_v.model.parameters(), initial, strict=True)
    )  # it did update
