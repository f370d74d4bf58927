"""``[eval]`` in `cadenza train`: held-out episodes every N steps logged as ``eval/*`` (and drawn to
OUT/eval.png), without changing what training does; an env with no held-out split is one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from cadenza.experiments.toolworld import make_source
from cadenza.metrics import read_metrics
from cadenza.rl.train.trainer import Trainer
from tests.support.rl_fixtures import TIMING, config


class NoSplit:
    """toolworld's sampling and envs, without a held-out split."""

    def __init__(self, options: dict) -> None:
        self.inner = make_source(options)

    def sample_tasks(self, rng, n, start_index=0):
        return self.inner.sample_tasks(rng, n, start_index)

    def make_env(self, task):
        return self.inner.make_env(task)


def no_split_source(options: dict) -> NoSplit:
    return NoSplit(options)


def _train(cfg) -> list[dict]:
    threads = torch.get_num_threads()
    try:
        return Trainer(cfg).train()
    finally:
        torch.set_num_threads(threads)


def test_eval_every_step_logs_heldout_metrics_and_leaves_training_alone(sft_model: Path, tmp_path: Path):
    cfg = config(sft_model, tmp_path / "eval", steps=3)
    cfg.eval.every, cfg.eval.num_tasks, cfg.eval.episodes_per_task = 2, 4, 2
    rows = _train(cfg)
    assert [("eval/reward" in r) for r in rows] == [False, True, True]  # every 2 steps and after the last
    for r in rows[1:]:
        assert r["eval/episodes"] == 8 and 0 <= r["eval/valid_call_rate"] <= 1
        assert 0 <= r["eval/resolved_rate"] <= 1 and r["eval/reward"] <= r["eval/resolved_rate"]
    assert (tmp_path / "eval" / "eval.png").stat().st_size > 1000
    # the held-out episodes train nothing and draw no training randomness
    plain = _train(config(sft_model, tmp_path / "plain", steps=3))

    def strip(rs):
        return [{k: v for k, v in r.items() if k not in TIMING and not k.startswith("eval/")} for r in rs]

    assert strip(rows) == strip(plain)
    assert read_metrics(tmp_path / "eval" / "metrics.jsonl") == rows


def test_env_without_heldout_split_is_one_line(sft_model: Path, tmp_path: Path):
    import tomli_w

    cfg = config(sft_model, tmp_path / "run", steps=1)
    cfg.env.name = f"{__name__}:no_split_source"
    cfg.eval.every = 1
    (tmp_path / "train.toml").write_text(tomli_w.dumps(cfg.to_dict()))
    proc = subprocess.run(
        [sys.executable, "-m", "cadenza", "train", str(tmp_path / "train.toml")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr[-2000:]
    assert "has no held-out split" in proc.stderr and "eval.tasks" in proc.stderr
