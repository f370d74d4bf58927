"""Asynchronous training with bounded staleness on toolworld: K = 0 is the synchronous loop bit for bit,
K = 1 / 2 keep their staleness schedule and log the mismatch, stale rollouts are dropped, resume is exact,
and a failing or hung engine stops training with one line and no thread left behind."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import pytest
import torch

from cadenza.checkpoint import step_name
from cadenza.errors import CadenzaError
from cadenza.metrics import read_metrics
from cadenza.rl.engines.hf import HFEngine
from cadenza.rl.rollout.episodes import collect_episodes
from cadenza.rl.rollout.pipeline import EngineError
from cadenza.rl.train import trainer as trainer_mod
from cadenza.rl.train.trainer import Trainer
from tests.support.rl_fixtures import TIMING, config

pytestmark = pytest.mark.usefixtures("_restore_threads")


@pytest.fixture
def _restore_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def run_config(model: Path, out: Path, steps: int, k: int, **rollout):
    cfg = config(model, out, steps=steps, lambda_sd=1.0, top_k=4)
    cfg.rollout = dataclasses.replace(cfg.rollout, max_staleness=k, **rollout)
    return cfg


def strip(rows):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def rollout_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "cadenza-rollouts"]


def test_k0_is_the_synchronous_loop_bit_for_bit(sft_model, tmp_path, monkeypatch):
    """Three ways to sample the same synchronous run give identical losses: the pipeline over the shared
    hf engine (the default), an engine with its own weight copy kept current by real ``sync_weights``,
    and the pre-engine loop (rollouts sampled inline from the trainer's own policy, no thread)."""
    default = Trainer(run_config(sft_model, tmp_path / "a", steps=3, k=0)).train()

    monkeypatch.setattr(
        trainer_mod,
        "build_engine",
        lambda cfg, policy, tok, version: HFEngine(policy, share=False, version=version),
    )
    copied = Trainer(run_config(sft_model, tmp_path / "b", steps=3, k=0)).train()
    monkeypatch.undo()

    class InlineTrainer(Trainer):
        def _rollouts(self, step):
            from cadenza.rl.rollout.episodes import sample_step_tasks

            tasks = sample_step_tasks(self.source, self.cfg, step)
            eps = collect_episodes(self.policy, self.tokenizer, self.source, self.cfg, step, tasks)
            for e in eps:  # the old loop sampled with the weights being trained, by construction
                e.trajectory.meta["policy_version"] = step - 1
            return eps, 0.0

        def _sync_engine(self, step):
            return 0.0

        def _queue(self, step):
            pass

    inline = InlineTrainer(run_config(sft_model, tmp_path / "c", steps=3, k=0)).train()
    assert strip(default) == strip(copied) == strip(inline)
    assert all(r["sd_tokens"] > 0 and not r["skipped_update"] for r in default)  # real updates happened
    assert all(r["staleness_max"] == 0 and r["dropped_stale"] == 0 for r in default)
    assert all(abs(r["mismatch_kl"]) < 1e-6 for r in default)  # same weights sample and train


@pytest.fixture(scope="module")
def four_steps(sft_model, tmp_path_factory):
    """The 4-step run at K (1 or 2), trained once for every test that compares against it."""
    runs: dict[int, list[dict]] = {}

    def get(k: int) -> list[dict]:
        if k not in runs:
            runs[k] = Trainer(run_config(sft_model, tmp_path_factory.mktemp(f"k{k}"), steps=4, k=k)).train()
        return runs[k]

    return get


@pytest.mark.parametrize("k", [1, 2])
def test_bounded_staleness_schedule_and_mismatch_metrics(sft_model, tmp_path, k, four_steps):
    rows = four_steps(k)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    # step s is sampled by version max(0, s - 1 - K): its staleness is exactly min(s - 1, K)
    assert [r["staleness_max"] for r in rows] == [min(s - 1, k) for s in range(1, 5)]
    assert [r["staleness_mean"] for r in rows] == [float(min(s - 1, k)) for s in range(1, 5)]
    assert all(r["dropped_stale"] == 0 and not r["skipped_update"] for r in rows)
    # sampled by the weights being trained: no mismatch; by older weights: a measurable one
    assert abs(rows[0]["mismatch_kl"]) < 1e-6
    assert all(r["mismatch_kl"] > 1e-5 for r in rows[1:]), [r["mismatch_kl"] for r in rows]
    assert all(0.0 <= r["is_truncated"] <= 1.0 for r in rows)
    if k == 2:  # K = 1 is run twice by the resume test below (an uninterrupted and a resumed run)
        again = Trainer(run_config(sft_model, tmp_path / "again", steps=4, k=k)).train()
        assert strip(again) == strip(rows)  # deterministic whatever the thread timings
    assert not rollout_threads()


class _CrashAtVersion(HFEngine):
    """Dies on its first generation with the weights of version ``at`` (a deterministic point in the run)."""

    def __init__(self, *a, at: int, **kw):
        super().__init__(*a, **kw)
        self.at = at

    def sample(self, request):
        if self.version == self.at:
            raise RuntimeError("engine process died")
        return super().sample(request)


def test_k1_resume_after_a_crash_is_exact(sft_model, tmp_path, monkeypatch, four_steps):
    """The checkpoint of step 2 keeps step 3's rollouts (sampled by version 1 while step 2 trained), so a
    run that dies in step 4's rollouts resumes exactly where an uninterrupted run would be."""
    full = four_steps(1)  # the uninterrupted run (also the K = 1 schedule test's)
    monkeypatch.setattr(
        trainer_mod,
        "build_engine",
        lambda cfg, policy, tok, version: _CrashAtVersion(policy, share=False, version=version, at=2),
    )
    with pytest.raises(EngineError, match="engine process died"):
        Trainer(run_config(sft_model, tmp_path / "b", steps=4, k=1)).train()
    monkeypatch.undo()
    resumed = Trainer(run_config(sft_model, tmp_path / "b", steps=4, k=1))
    assert resumed.step == 2 and sorted(resumed._restored) == [3]
    assert strip(resumed.train()) == strip(full)


class _LaggingEngine(HFEngine):
    """Stamps the first prompt of every batch with weights two versions older than it really used."""

    def sample(self, request):
        out = super().sample(request)
        out[0].policy_version -= 2
        return out


def test_stale_trajectories_are_dropped_and_counted(sft_model, tmp_path, monkeypatch):
    monkeypatch.setattr(
        trainer_mod,
        "build_engine",
        lambda cfg, policy, tok, version: _LaggingEngine(policy, share=False, version=version),
    )
    rows = Trainer(run_config(sft_model, tmp_path / "run", steps=3, k=1)).train()
    # the first episode of each step is stale by min(s - 1, 1) + 2 > K = 1 and leaves the update
    assert [r["dropped_stale"] for r in rows] == [1, 1, 1]
    assert [r["dropped_stale_total"] for r in rows] == [1, 2, 3]
    assert all(r["staleness_max"] <= 1 for r in rows) and rows[-1]["episodes"] == 3 * 7


class _FailingEngine(HFEngine):
    """Crashes or hangs on its ``at``-th generation call (a hang ends only when the engine is closed)."""

    def __init__(self, *a, at: int, mode: str, **kw):
        super().__init__(*a, **kw)
        self.at, self.mode, self.calls, self.released = at, mode, 0, threading.Event()

    def sample(self, request):
        self.calls += 1
        if self.calls == self.at:
            if self.mode == "hang":
                self.released.wait(60)
            raise RuntimeError("connection reset by peer\nsecond line")
        return super().sample(request)

    def sync_weights(self, named_tensors, *, version):
        if self.mode == "sync" and version == 2:
            raise RuntimeError("weight upload rejected")
        super().sync_weights(named_tensors, version=version)

    def close(self):
        self.released.set()


@pytest.mark.parametrize("mode", ["crash", "hang", "sync"])
def test_engine_failure_mid_step_is_one_line_and_leaves_nothing(sft_model, tmp_path, monkeypatch, mode):
    def build(cfg, policy, tok, version):  # every step makes 1-3 generation calls: call 9 is mid-run
        return _FailingEngine(
            policy, share=False, version=version, at=9 if mode != "sync" else 10**6, mode=mode
        )

    monkeypatch.setattr(trainer_mod, "build_engine", build)
    # only the hang needs a short timeout: under load one real generation of the crash and sync runs
    # can take over 1 s, and they would stop on the timeout instead of the failure they check
    timeout = 1.0 if mode == "hang" else 120.0
    cfg = run_config(sft_model, tmp_path / "run", steps=6, k=1, engine_timeout_s=timeout)
    cfg.run = dataclasses.replace(cfg.run, checkpoint_every=1)
    t0 = time.monotonic()
    with pytest.raises(EngineError) as err:
        Trainer(cfg).train()
    assert time.monotonic() - t0 < 30
    msg = str(err.value)
    assert "\n" not in msg and "engine 'hf'" in msg
    want = {"crash": "generation: RuntimeError: connection reset by peer", "hang": "generation within 1 s",
            "sync": "weight sync to version 2: RuntimeError: weight upload rejected"}  # fmt: skip
    assert want[mode] in msg, msg
    assert isinstance(err.value, CadenzaError) and not rollout_threads()
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    done = [r["step"] for r in rows]
    assert done == list(range(1, len(done) + 1)) and len(done) < 6  # only whole steps were logged
    root = tmp_path / "run" / "checkpoints"
    ckpts = sorted(p.name for p in root.iterdir()) if root.exists() else []
    assert ckpts == [step_name(s) for s in done][-2:]  # one per logged step (keep 2), none half-written


def test_subprocess_engine_samples_exactly_like_in_process(sft_model, tmp_path, monkeypatch):
    """K = 1 uses the child-process hf engine (shared-memory weights, generator state sent along): the
    run equals one sampled in-process from a synced copy, bit for bit, and no child outlives it."""
    from cadenza.rl.train.local_engine import ProcessHFEngine

    engines = []
    real_build = trainer_mod.build_engine

    def build(cfg, policy, tok, version):
        engines.append(real_build(cfg, policy, tok, version=version))
        return engines[-1]

    monkeypatch.setattr(trainer_mod, "build_engine", build)
    rows = Trainer(run_config(sft_model, tmp_path / "proc", steps=3, k=1)).train()
    assert isinstance(engines[0], ProcessHFEngine) and not engines[0]._proc.is_alive()
    monkeypatch.setattr(
        trainer_mod,
        "build_engine",
        lambda cfg, policy, tok, version: HFEngine(policy, share=False, version=version),
    )
    same = Trainer(run_config(sft_model, tmp_path / "local", steps=3, k=1)).train()
    assert strip(rows) == strip(same)


def test_killed_engine_process_stops_training_with_one_line(sft_model, tmp_path, monkeypatch):
    import os
    import signal

    from cadenza.rl.train.local_engine import ProcessHFEngine

    class KilledAfterFirstSync(ProcessHFEngine):
        def sync_weights(self, named_tensors, *, version):
            super().sync_weights(named_tensors, version=version)
            os.kill(self.pid, signal.SIGKILL)  # the engine dies between two steps' rollouts

    engines = []

    def build(cfg, policy, tok, version):
        engines.append(KilledAfterFirstSync(policy, version=version, timeout_s=cfg.rollout.engine_timeout_s))
        return engines[-1]

    monkeypatch.setattr(trainer_mod, "build_engine", build)
    with pytest.raises(CadenzaError) as err:  # the engine's own one-line error
        # engine_timeout_s well above a loaded machine's batch time: the death is seen at once anyway
        Trainer(run_config(sft_model, tmp_path / "run", steps=4, k=1, engine_timeout_s=120.0)).train()
    msg = str(err.value)
    assert "\n" not in msg and "engine 'hf' process" in msg and "exited with code -9" in msg, msg
    assert not engines[0]._proc.is_alive() and not rollout_threads()


def test_engine_context_overflow_ends_episodes_as_context_and_training_goes_on(
    sft_model,
    tmp_path,
    monkeypatch,
):
    """A served engine's HTTP 400 'maximum context length' (passed on as a plain exception) ends the
    episode as context-exhausted; it is graded and trained on like any other episode."""
    probe = Trainer(run_config(sft_model, tmp_path / "probe", steps=1, k=0), resume=False)
    window = max(e.rollout.tokens.turn_spans[0][0] for e in probe.collect(1))  # only first turns fit
    probe.close()

    class Windowed(HFEngine):
        def sample(self, request):
            if any(len(p) > window for p in request.prompts):
                raise RuntimeError(f"HTTP 400: This model's maximum context length is {window} tokens.")
            return super().sample(request)

    monkeypatch.setattr(
        trainer_mod,
        "build_engine",
        lambda cfg, policy, tok, version: Windowed(policy, share=False, version=version),
    )
    trainer = Trainer(run_config(sft_model, tmp_path / "run", steps=2, k=1))
    eps = trainer.collect(1)
    reasons = {e.rollout.tokens.metadata["stop_reason"] for e in eps}
    assert "context" in reasons and reasons <= {"context", "no_tool_call", "env_done"}
    assert all(len(e.trajectory.turns) == 1 and "reward" in e.rollout.outcome for e in eps)
    rows = trainer.train()
    assert [r["step"] for r in rows] == [1, 2] and rows[-1]["turns_per_episode"] == 1.0


def test_partial_rollouts_train_within_the_staleness_bound(sft_model, tmp_path):
    """K = 2 with partial rollouts (the sync lands between batches of the rollout in progress): every
    step trains, no trajectory is older than the bound (its oldest turn's version), nothing is left."""
    rows = Trainer(run_config(sft_model, tmp_path / "run", steps=4, k=2, partial_rollouts=True)).train()
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(0 <= r["staleness_max"] <= min(r["step"] - 1, 2) for r in rows), rows
    assert all(r["dropped_stale"] == 0 and not r["skipped_update"] for r in rows)
    assert not rollout_threads()
