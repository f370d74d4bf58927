"""The trainer end to end on toolworld: CLI run, SD loss on hinted turns goes down, exact resume, bad
configs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from cadenza.errors import CadenzaError
from cadenza.metrics import read_metrics
from cadenza.rl.config import (
    TrainConfig,
)
from cadenza.rl.learn.step import rl_losses
from cadenza.rl.learn.teacher import build_hinted_turns
from cadenza.rl.text.tokens import collate
from cadenza.rl.train.trainer import Trainer
from tests.support.rl_fixtures import TIMING, config


@pytest.fixture(autouse=True)
def _restore_threads():
    """The trainer sets torch's thread count (run.threads); leave the process as it was."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def write_toml(path: Path, cfg: TrainConfig) -> None:
    import tomli_w

    data = cfg.to_dict()
    path.write_text(tomli_w.dumps(data))


def sd_loss_on(trainer: Trainer, episodes) -> float:
    """Mean SD divergence over the hinted turns of ``episodes`` under the trainer's current weights."""
    toks = [e.rollout.tokens for e in episodes]
    items = build_hinted_turns(toks, [e.hints for e in episodes], trainer.tokenizer)
    assert items, "the fixture policy made no tool-not-found mistakes to hint at"
    batch = collate(toks, trainer.tokenizer.pad_token_id)
    adv = torch.zeros(len(toks))
    with torch.no_grad():
        return float(
            rl_losses(
                trainer.policy, batch, adv, items=items, teacher=trainer.teacher, loss=trainer.cfg.loss
            ).sd.loss
        )


def test_train_cli_end_to_end_sd_loss_on_hinted_turns_decreases(sft_model, tmp_path):
    cfg = config(sft_model, tmp_path / "run", steps=10, lambda_sd=2.0)
    # a live teacher: the divergence checked below is then the one the trainer minimises step by step
    # (with the default frozen teacher this 60-step fixture's SD loss need not fall within 10 steps).
    # lr 1e-3, not the fixture's 3e-3: at 3e-3 some seeds' SD-only updates diverge within 6 steps
    # (entropy 0.5 -> 5.9), whichever rollout loop sampled them (measured over run seeds 3-6).
    cfg.teacher.weights = "live"
    cfg.optim.lr = 1e-3
    write_toml(tmp_path / "train.toml", cfg)
    proc = subprocess.run(
        [sys.executable, "-m", "cadenza", "train", str(tmp_path / "train.toml")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 11))
    for key in (
        "reward",
        "resolved_rate",
        "invalid_tool_rate",
        "sd_loss",
        "kl_unhinted",
        "entropy_unhinted",
        "tokens_per_s",
    ):
        assert all(r[key] is not None for r in rows), key
    assert rows[-1]["episodes"] == 10 * 8 and all(r["hinted_turns"] > 0 for r in rows[:2])
    ckpt = tmp_path / "run" / "checkpoints" / "step-00000010"
    assert {"model.safetensors", "optimizer.pt", "state.pt", "meta.json"} <= {p.name for p in ckpt.iterdir()}

    # held-out check: the hinted turns of three fixed batches, before vs after training (pooled: one
    # batch's hinted turns are few and its divergence moves either way; with lambda_sd = 0 and no
    # reward this run makes no update at all, so the ratio would be exactly 1)
    probe_cfg = config(sft_model, tmp_path / "probe", steps=1, lambda_sd=2.0)
    probe_cfg.teacher.weights = "live"
    probe = Trainer(probe_cfg, resume=False)
    batches = [probe.collect(seed) for seed in (101, 202, 303)]
    before = sum(sd_loss_on(probe, episodes) for episodes in batches)
    probe.model.load_state_dict(load_file(str(ckpt / "model.safetensors")))
    after = sum(sd_loss_on(probe, episodes) for episodes in batches)
    assert after < 0.9 * before, (before, after)


def test_exact_resume_matches_uninterrupted_run(sft_model, tmp_path):
    full = Trainer(config(sft_model, tmp_path / "a", steps=4, lambda_sd=1.0, top_k=4))
    rows_full = full.train()
    first = Trainer(config(sft_model, tmp_path / "b", steps=2, lambda_sd=1.0, top_k=4))
    first.train()
    resumed = Trainer(config(sft_model, tmp_path / "b", steps=4, lambda_sd=1.0, top_k=4))
    assert resumed.step == 2
    rows_resumed = resumed.train()
    strip = lambda rows: [{k: v for k, v in r.items() if k not in TIMING} for r in rows]  # noqa: E731
    assert strip(rows_resumed) == strip(rows_full)
    a = load_file(str(tmp_path / "a" / "checkpoints" / "step-00000004" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "checkpoints" / "step-00000004" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # a checkpoint is never resumed under a different config
    with pytest.raises(CadenzaError, match=r"different config \(loss.lambda_sd\)"):
        Trainer(config(sft_model, tmp_path / "b", steps=4, lambda_sd=0.5, top_k=4))
    # resuming a finished run does nothing
    again = Trainer(config(sft_model, tmp_path / "b", steps=4, lambda_sd=1.0, top_k=4))
    assert again.step == 4 and len(again.train()) == 4


def test_train_cli_config_errors_are_one_line(sft_model, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[model]\npath = "no/such/model"\n[loss]\nlambda_sd = 1.0\n')
    proc = subprocess.run(
        [sys.executable, "-m", "cadenza", "train", str(bad)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: model.path") and "does not exist" in lines[0]
    bad.write_text("[rollout]\ngroup_sise = 4\n")
    proc = subprocess.run(
        [sys.executable, "-m", "cadenza", "train", str(bad)], capture_output=True, text=True, timeout=120
    )
    assert (
        proc.returncode == 2 and "did you mean 'group_size'" in proc.stderr and "Traceback" not in proc.stderr
    )
    # a model whose tokenizer cannot render chats is refused before any rollout
    model = tmp_path / "model"
    shutil.copytree(sft_model, model)
    (model / "chat_template.jinja").unlink()
    bad.write_text(f'[model]\npath = "{model}"\n')
    proc = subprocess.run(
        [sys.executable, "-m", "cadenza", "train", str(bad)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2 and "has no chat template" in proc.stderr and "Traceback" not in proc.stderr
