"""The RL trainer on several ranks (rank 0 collects, every rank learns its share) against one process.

The reference is the single-process trainer on the same config: two gloo ranks must end with the same
weights as it (up to float summation order) and with equal replicas, after steps that really updated
the policy through both the GRPO and the self-distillation term. The CLI test starts two real
``python -m cadenza train`` processes the way torchrun does (RANK, WORLD_SIZE, LOCAL_RANK in the
environment; the rendezvous through a shared file, since a TCP store would listen beyond loopback),
with rank 0 driving Ray rollout actors.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from cadenza.metrics import read_metrics
from cadenza.rl.config import TrainConfig
from cadenza.rl.train.checkpoint import latest_checkpoint
from cadenza.testing import spawn
from tests.support.rl_fixtures import config

pytestmark = pytest.mark.serial("ray")  # the CLI test starts a Ray cluster (tests/README.md)

STEPS = 2
COMPARED = ("grpo_loss", "sd_loss", "grad_norm", "reward", "clip_fraction")


def _config(model: Path, out: Path, steps: int = STEPS, max_staleness: int = 0) -> TrainConfig:
    cfg = config(model, out, steps=steps, lambda_sd=1.0)
    cfg.rollout.max_staleness = max_staleness
    cfg.rollout.group_size, cfg.rollout.tasks_per_step = 4, 2
    cfg.optim.microbatch = 3  # 8 episodes: microbatches of 3, 3, 2, split unevenly over two ranks
    cfg.run.checkpoint_every = 0
    return cfg


def _train(cfg: TrainConfig) -> tuple[dict[str, torch.Tensor], list[dict]]:
    from cadenza.rl.train.trainer import Trainer

    torch.set_num_threads(1)
    trainer = Trainer(cfg, resume=False)
    rows = trainer.train()
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}, rows


def _train_rank(rank: int, world: int, cfg: TrainConfig):
    weights, rows = _train(cfg)
    # numpy: a tensor sent through the result queue is a shared-memory handle that dies with this process
    return {n: w.numpy() for n, w in weights.items()}, rows


@pytest.fixture(scope="module")
def reference(sft_model, tmp_path_factory):
    """The single-process run: weights, metric rows, and the weights it started from."""
    out = tmp_path_factory.mktemp("single")
    weights, rows = _train(_config(sft_model, out))
    start = load_file(str(sft_model / "model.safetensors"))
    return weights, rows, start


def test_two_ranks_train_like_one_process(reference, sft_model, tmp_path):
    ref_weights, ref_rows, start = reference
    # the comparison means something only if both terms of the loss moved the weights
    assert len(ref_rows) == STEPS and not any(r["skipped_update"] for r in ref_rows)
    assert sum(r["sd_tokens"] for r in ref_rows) > 0, "no hinted turn: the SD term was never trained"
    moved = max(float((ref_weights[n] - start[n]).abs().max()) for n in start if n in ref_weights)
    assert moved > 1e-3

    results = spawn(_train_rank, 2, _config(sft_model, tmp_path / "dp"), preload=("torch", "transformers"))
    (w0, rows0), (w1, rows1) = [({n: torch.from_numpy(a) for n, a in w.items()}, rows) for w, rows in results]
    assert rows1 == [], "only rank 0 logs metrics"
    for name, ref in ref_weights.items():
        assert torch.equal(w0[name], w1[name]), f"replicas diverged at {name}"
        torch.testing.assert_close(w0[name], ref, rtol=1e-5, atol=1e-6, msg=f"{name} differs from 1 rank")
    for got, want in zip(rows0, ref_rows, strict=True):
        assert got["episodes"] == want["episodes"] and got["sd_tokens"] == want["sd_tokens"]
        for key in COMPARED:
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), key


def _write_toml(path: Path, cfg: TrainConfig) -> Path:
    import tomli_w

    path.write_text(tomli_w.dumps(cfg.to_dict()))
    return path


@pytest.mark.slow
def test_cli_on_two_ranks_with_ray_rollouts_matches_one_process(sft_model, tmp_path):
    # Ray actors draw each task's episodes from that task's own generator (the in-process path samples
    # the step as one batch), so the reference is one process driving the same single actor
    # K=1: rank 0's rollout thread runs a step ahead; step 3 is sampled by the weights of step 1,
    # synced from rank 0 into the actor
    ref_cfg = _config(sft_model, tmp_path / "single", steps=3, max_staleness=1)
    ref_cfg.rollout.executor, ref_cfg.rollout.workers = "ray", 1
    ref_weights, ref_rows = _train(ref_cfg)
    cfg = _config(sft_model, tmp_path / "run", steps=3, max_staleness=1)
    toml = _write_toml(tmp_path / "train.toml", cfg)
    env = {
        **os.environ,
        "WORLD_SIZE": "2",
        "CADENZA_INIT_METHOD": f"file://{tmp_path / 'rendezvous'}",
        "OMP_NUM_THREADS": "1",
    }
    cmd = [sys.executable, "-m", "cadenza", "train", str(toml), "--executor", "ray", "--workers", "1"]
    procs = [
        subprocess.Popen(
            cmd,
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=600)[0])
    finally:
        for p in procs:
            p.kill()
    for r, (p, out) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0, f"rank {r} failed:\n{out[-3000:]}"
    assert "done: step 3" in outs[0] and "done:" not in outs[1], "rank 0 alone reports"
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3], "one metrics row per step, written once"
    assert [r["policy_version"] for r in rows] == [0, 1, 2] and rows[-1]["staleness_max"] == 1
    for got, want in zip(rows, ref_rows, strict=True):
        assert got["sd_tokens"] == want["sd_tokens"] and not got["skipped_update"]
        assert got["grpo_loss"] == pytest.approx(want["grpo_loss"], rel=1e-5, abs=1e-7)
    ckpt = latest_checkpoint(tmp_path / "run")
    assert ckpt is not None
    saved = load_file(str(ckpt / "model.safetensors"))
    for name, ref in ref_weights.items():
        if name in saved:
            torch.testing.assert_close(saved[name], ref, rtol=1e-5, atol=1e-6)
