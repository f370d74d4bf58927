"""``cadenza train`` with the real vLLM engine (CPU build): synchronous and asynchronous (K = 1) runs end
to end, the engine synced after every update, the staleness schedule kept, no engine process left.

The synchronous run is shared (``k0_run``, one engine start): its step-1 update is compared with the
hf-engine trainer's on the same episodes, and a second trainer resumes from its last checkpoint.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import torch

from cadenza.errors import EngineError
from cadenza.rl.engines.policy import HFPolicy
from cadenza.rl.engines.sync_check import ParityProbe
from cadenza.rl.train.trainer import Trainer
from tests.support.engine_helpers import TOL, hf_logprobs, requires_vllm
from tests.support.engine_helpers import engine_processes as _engine_processes
from tests.support.engine_helpers import free_port as _free_port
from tests.support.rl_fixtures import config

pytestmark = [pytest.mark.slow, pytest.mark.serial, requires_vllm]

STEPS = 3  # checkpoint_every = 2: checkpoints at steps 2 and 3


def _cfg(model: Path, out: Path, *, steps: int, k: int = 0, port: int = 0, probe: float = 1e-3):
    cfg = config(model, out, steps=steps, lambda_sd=1.0)
    cfg.rollout = dataclasses.replace(
        cfg.rollout, engine="vllm", max_staleness=k, engine_timeout_s=300, sync_probe_tol=probe,
        engine_options={"max_model_len": 1024, "kv_cache_gib": 1, "port": port},
    )  # fmt: skip
    return cfg


def _check_run(rows: list[dict], k: int, out: Path, port: int) -> None:
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["sync_s"] > 0 for r in rows)  # the engine took new weights after every update
    assert [r["staleness_max"] for r in rows] == [min(s - 1, k) for s in (1, 2, 3)]
    assert all(r["mismatch_kl"] > -1e-6 and r["episodes"] > 0 for r in rows)  # k3 >= 0 up to rounding
    if k == 0:  # same weights on both sides: engine and trainer log-probs agree (fp32 engine)
        assert max(r["mismatch_kl"] for r in rows) < 1e-3
    assert (out / "engine.log").is_file()
    assert _engine_processes(port) == []  # the engine did not outlive the run


@pytest.fixture(scope="module")
def k0_run(sft_model_32, tmp_path_factory):
    """``cadenza train`` at K = 0 for 3 steps (the parity probe after every sync); step 1's episodes, its
    update's result and the weights right after it are kept for the comparison with the hf engine."""
    out = tmp_path_factory.mktemp("k0") / "run"
    trainer = Trainer(_cfg(sft_model_32, out, steps=STEPS))  # port 0: the resume test restarts the engine
    step1: dict = {"off_policy": trainer.learner.off_policy}
    update = trainer.learner.update

    def spy(episodes, *, step):  # type: ignore[no-untyped-def]
        if step == 1:
            step1["episodes"] = copy.deepcopy(episodes)
            step1["port"] = trainer._engine.engine.server.port  # the port the server picked
        result = update(episodes, step=step)
        if step == 1:
            step1["update"] = result
            step1["weights"] = [p.detach().clone() for p in trainer.model.parameters()]
        return result

    trainer.learner.update = spy
    rows = trainer.train()
    return rows, out, step1["port"], step1


def test_train_with_the_vllm_engine_k0(k0_run):
    rows, out, port, _ = k0_run
    _check_run(rows, 0, out, port)


def test_train_with_the_vllm_engine_k1(sft_model_32, tmp_path):
    port = _free_port()
    rows = Trainer(_cfg(sft_model_32, tmp_path / "run", steps=STEPS, k=1, port=port, probe=0.0)).train()
    _check_run(rows, 1, tmp_path / "run", port)


def test_k0_losses_on_vllm_samples_equal_the_hf_engine_path(k0_run, sft_model_32, tmp_path):
    """The same vLLM-sampled episodes give the same update through the vLLM trainer (truncated IS on the
    engine's log-probs, ratios ~1 at K = 0) as through the hf-engine trainer (no IS): the losses agree and
    the updated weights agree, so K = 0 with vLLM is the synchronous algorithm, not an approximation of it."""
    step1 = k0_run[3]
    episodes, upd_v = step1["episodes"], step1["update"]
    trainer_h = Trainer(config(sft_model_32, tmp_path / "h", steps=1, lambda_sd=1.0))
    assert step1["off_policy"] and not trainer_h.learner.off_policy
    upd_h = trainer_h.learner.update(copy.deepcopy(episodes), step=1)
    assert upd_v.grpo_loss == pytest.approx(upd_h.grpo_loss, abs=1e-6)
    assert upd_v.sd_loss == pytest.approx(upd_h.sd_loss, abs=1e-6) and upd_v.sd_tokens == upd_h.sd_tokens
    assert upd_v.is_truncated == 0.0
    names = [name for name, _ in trainer_h.model.named_parameters()]
    for name, a, b in zip(names, step1["weights"], trainer_h.model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), name
    initial = HFPolicy.from_pretrained(sft_model_32).model.parameters()
    assert any(not torch.equal(a, b) for a, b in zip(step1["weights"], initial, strict=True))  # it did update


def test_resume_syncs_the_checkpoint_weights_before_the_first_rollout(k0_run, sft_model_32):
    """A served engine loads ``model.path`` (the initial weights). Before the fix it was labelled with the
    resumed checkpoint's version, so the trainer skipped the first sync and the first steps after a
    resume sampled from the initial policy while reporting staleness 0. The runtime parity probe
    (``rollout.sync_probe_tol``) runs after every sync of both runs and stops a run whose engine does not
    hold the trainer's weights."""
    rows, out, _, _ = k0_run  # checkpoint at step 3
    assert rows[-1]["step"] == STEPS and not rows[-1]["skipped_update"]
    trainer = Trainer(_cfg(sft_model_32, out, steps=STEPS + 1))
    try:
        assert trainer.step == STEPS
        engine = trainer._engine_at(STEPS)  # what the next step's rollouts will sample from (the probe ran)
        assert engine.version == STEPS
        seq = [*ParityProbe(trainer.tokenizer, 1.0).ids, 5, 9, 17, 3]
        got = torch.tensor(engine.engine.score([seq])[0])
        initial = hf_logprobs(HFPolicy.from_pretrained(sft_model_32), seq)
        resumed = hf_logprobs(trainer.policy, seq)
        assert float((resumed - initial).abs().max()) > 10 * TOL  # the checkpoint moved the weights
        assert float((got - resumed).abs().max()) <= TOL  # and the engine holds them, not the initial ones
        # the probe stops a run whose engine holds other weights (here: the initial ones, synced back)
        initial_model = HFPolicy.from_pretrained(sft_model_32).model
        engine.sync_weights(initial_model.named_parameters(), version=STEPS)
        with pytest.raises(EngineError, match="differ from the trainer's"):
            trainer._check_parity(STEPS)
    finally:
        trainer.close()
