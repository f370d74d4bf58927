"""The hint-following diagnostic inside real trainer runs on toolworld: logged, and stopping a run by
threshold."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cadenza.feedback.generate import FeedbackConfig
from cadenza.metrics import read_metrics
from cadenza.rl.config import (
    EnvConfig,
    LossConfig,
    ModelConfig,
    OptimConfig,
    ProbeConfig,
    RolloutConfig,
    RunConfig,
    TeacherConfig,
    TrainConfig,
)
from cadenza.rl.learn.probe import KEYS, HintFollowingEroded
from cadenza.rl.train.checkpoint import latest_checkpoint
from cadenza.rl.train.trainer import Trainer


def _cfg(model: Path, out: Path, weights: str, *, lr: float, stop_ratio: float = 0.0) -> TrainConfig:
    return TrainConfig(
        run=RunConfig(out_dir=str(out), steps=4, seed=1, progress=False, threads=1, measure_kl=False),
        model=ModelConfig(path=str(model)),
        env=EnvConfig(name="toolworld", options={"min_steps": 2, "max_steps": 2, "extra_turns": 1}),
        rollout=RolloutConfig(group_size=4, tasks_per_step=2, max_new_tokens=24, max_turns=3),
        loss=LossConfig(lambda_sd=1.0),
        teacher=TeacherConfig(weights=weights),
        probe=ProbeConfig(every=1, items=6, stop_ratio=stop_ratio),
        optim=OptimConfig(lr=lr, microbatch=8),
        feedback=FeedbackConfig(kinds=["tool_not_found"]),
    )


@pytest.fixture(autouse=True)
def _restore_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_trainer_logs_the_diagnostic_every_step(sft_model, tmp_path):
    assert TeacherConfig().weights == "frozen"  # the default the evidence supports
    Trainer(_cfg(sft_model, tmp_path / "frozen", "frozen", lr=3e-3)).train()
    rows = read_metrics(tmp_path / "frozen" / "metrics.jsonl")
    assert [r["probe_weights_step"] for r in rows] == [0, 1, 2, 3]
    assert all(0 <= r[k] <= 1 for r in rows for k in KEYS)
    assert rows[0]["probe_teacher_hinted"] > rows[0]["probe_teacher_unhinted"]  # the hint carries information
    assert len({r["probe_teacher_hinted"] for r in rows}) == 1  # a frozen teacher cannot erode
    assert len({r["probe_student_unhinted"] for r in rows}) > 1  # while the student moves


def test_diagnostic_stops_a_live_run_that_wrecks_hint_following(sft_model, tmp_path):
    # lr 0.1 wrecks the shared weights in one step; a live teacher is those weights
    with pytest.raises(HintFollowingEroded, match="teacher P\\(correct \\| hint\\)"):
        Trainer(_cfg(sft_model, tmp_path / "live", "live", lr=0.1, stop_ratio=0.5)).train()
    rows = read_metrics(tmp_path / "live" / "metrics.jsonl")
    assert rows[-1]["probe_teacher_hinted"] < 0.5 * rows[0]["probe_teacher_hinted"] and len(rows) < 4
    assert latest_checkpoint(tmp_path / "live") is not None  # saved before stopping
    # the same run with a frozen teacher keeps its target and is not stopped
    Trainer(_cfg(sft_model, tmp_path / "frozen", "frozen", lr=0.1, stop_ratio=0.5)).train()
    assert len(read_metrics(tmp_path / "frozen" / "metrics.jsonl")) == 4
