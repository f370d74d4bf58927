"""``cadenza train`` on the dual mesh: the real CLI on 4 gloo ranks with ``[parallel] ep = 2`` against one
process, and a resume of its DCP checkpoint at world 2.

The model is a tiny Qwen3-MoE (hidden 64, 2 layers, 8 experts) on toolworld with Muon, so the routed
experts live split over the EP mesh, the dense weights on the dense mesh, and the frozen teacher and the
KL reference are sharded alike. Newton–Schulz runs in float32 (``optim.muon_ns_dtype``): in bfloat16 it
rounds the 1e-7 summation-order differences of a sharded gradient into 1e-3 update differences. The
ranks are launched the way torchrun launches them (RANK, WORLD_SIZE, LOCAL_RANK), meeting through a
shared file instead of a TCP store (which would listen beyond loopback).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from cadenza.metrics import read_metrics
from cadenza.rl.config import ParallelDims, TrainConfig
from cadenza.rl.train.checkpoint import list_checkpoints
from tests.support.ranks import run_ranks
from tests.support.rl_fixtures import config

STEPS = 3
TOP_K = 8
COMPARED = ("reward", "grpo_loss", "sd_loss", "grad_norm", "kl_unhinted", "clip_fraction", "entropy_unhinted")
COUNTS = ("model_tokens", "sd_tokens", "episodes", "hinted_turns")
# Under cp > 1 everything but the update's own KL agrees within 5e-6 (world 8, cp = 2, ep = 8); the KL of
# the update (``kl_unhinted``: k3 between the weights before and after it) is second order in the update
# alone, which float32 rounding of another attention kernel, amplified by Newton–Schulz, moves by up to
# 1.4e-4 (world 1 with another microbatch size: 1.4e-5). The split itself is exact: test_context_parallel
# matches a float64 single process on the losses and every gradient.
CP_REL = {"kl_unhinted": 5e-4}


def _config(model: Path, out: Path, ep: int = 1, cp: int = 1, top_k: int = 0) -> TrainConfig:
    cfg = config(model, out, steps=STEPS, lambda_sd=1.0, kl_ref=0.05, drop_zero_variance=False, top_k=top_k)
    cfg.env.options = {"min_steps": 1, "max_steps": 1, "extra_turns": 1}
    cfg.optim.name, cfg.optim.muon_ns_dtype, cfg.optim.microbatch = "muon", "float32", 3  # 8 episodes: 3+3+2
    cfg.run.checkpoint_every, cfg.run.keep_checkpoints = 2, 3
    cfg.parallel = ParallelDims(ep=ep, cp=cp)
    return cfg


def _launch(cfg: TrainConfig, world: int, tmp: Path, *, check: bool = True) -> list[tuple[int, str]]:
    """``python -m cadenza train`` on ``world`` ranks, as torchrun starts them; exit code and output."""
    import tomli_w

    toml = tmp / f"train-{world}.toml"
    toml.write_text(tomli_w.dumps(cfg.to_dict()))
    return run_ranks([sys.executable, "-m", "cadenza", "train", str(toml)], world, tmp, check=check)


def _same(got: dict, want: dict, rel: dict[str, float] | None = None) -> float:
    """Assert one step's metrics agree (within 1e-4 relative unless ``rel`` names another tolerance);
    returns the largest relative gap (the CP tests print theirs, ``-s``)."""
    gaps = {k: abs(got[k] - want[k]) / max(abs(want[k]), 1e-12) for k in COMPARED}
    shown = {k: f"{v:.1e}" for k, v in gaps.items()}
    print(f"step {got['step']}: relative gaps {shown}")
    for key in COUNTS:
        assert got[key] == want[key], key
    for key in COMPARED:
        tol = (rel or {}).get(key, 1e-4)
        assert got[key] == pytest.approx(want[key], rel=tol, abs=1e-7), (got["step"], key)
    return max(gaps.values())


def _single(cfg: TrainConfig) -> list[dict]:
    """The single-process run of ``cfg`` (no ``[parallel]`` sharding at world 1)."""
    import torch

    from cadenza.rl.train.trainer import Trainer

    torch.set_num_threads(1)
    rows = Trainer(cfg, resume=False).train()
    # the comparison means something only if every term of the loss moved the weights
    assert len(rows) == STEPS and not any(r["skipped_update"] for r in rows)
    assert all(r["sd_tokens"] > 0 for r in rows) and any(r["grpo_loss"] != 0 for r in rows)
    return rows


@pytest.fixture(scope="module")
def reference(sft_moe, tmp_path_factory) -> list[dict]:
    """One process, the SD divergence over the teacher's top-k tokens (what every sharded run here uses;
    the full-vocabulary divergence on sharded ranks: tests/distributed/rl/test_data_parallel_trainer.py)."""
    return _single(_config(sft_moe, tmp_path_factory.mktemp("single") / "run", ep=2, top_k=TOP_K))


def test_four_ranks_with_ep_2_train_like_one_process_and_resume_at_world_2(reference, sft_moe, tmp_path):
    out = tmp_path / "run"
    outs = [o for _, o in _launch(_config(sft_moe, out, ep=2, top_k=TOP_K), 4, tmp_path)]
    assert "done: step 3" in outs[0] and not any("done:" in o for o in outs[1:]), "rank 0 alone reports"
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for got, want in zip(rows, reference, strict=True):
        _same(got, want)
    ckpts = list_checkpoints(out)
    meta = json.loads((ckpts[-1] / "meta.json").read_text())
    assert meta["format"] == "dcp" and meta["world_size"] == 4 and meta["modules"] == ["reference", "teacher"]
    assert not (ckpts[-1] / "model.safetensors").exists()  # shards, not a gathered model

    # resume the step-2 checkpoint of the world-4 run at world 2: step 3 as in the uninterrupted run
    shutil.rmtree(ckpts[-1])
    assert list_checkpoints(out)[-1].name.endswith("2")
    _launch(_config(sft_moe, out, ep=2, top_k=TOP_K), 2, tmp_path)
    resumed = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [1, 2, 3]
    _same(resumed[-1], reference[-1])


@pytest.mark.slow
def test_eight_ranks_with_cp_2_and_ep_8_train_like_one_process(reference, sft_moe, tmp_path):
    """The recipe's layout: CP pairs and one expert per rank on the same 8 ranks (ep = dp_shard·cp), so
    every routed token crosses the all-to-all, each CP pair splitting every sequence of its microbatches,
    with the SD divergence over the teacher's top-k tokens. (EP without CP: the world-4 test above; one
    world-8 run covers both the expert layout and the CP split, at the cost of one 8-process launch.)"""
    out = tmp_path / "run"
    _launch(_config(sft_moe, out, ep=8, cp=2, top_k=TOP_K), 8, tmp_path)
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    gaps = [_same(got, want, CP_REL) for got, want in zip(rows, reference, strict=True)]
    print(f"world 8, cp 2, ep 8: largest relative gap per step {gaps}")


def test_cp_that_cannot_split_the_sequences_is_one_line(sft_moe, tmp_path):
    """cp = 2 needs 4 chunks; rollout.max_context_tokens = 3 cannot give each a token."""
    cfg = _config(sft_moe, tmp_path / "bad", cp=2)
    cfg.rollout.max_context_tokens = 3
    for code, out in _launch(cfg, 2, tmp_path, check=False):
        assert code == 2 and "Traceback" not in out, out[-2000:]
        last = out.strip().splitlines()[-1]
        assert "rollout.max_context_tokens = 3 is shorter" in last and "lower parallel.cp" in last, last


def test_parallel_mistakes_are_one_line_before_any_rank_works(sft_moe, tmp_path):
    """ep = 3 does not divide 8 experts (read from config.json): rank 0 leaves with the one line, the
    others silently, all with exit 2, before any model is loaded (no hang, no traceback)."""
    results = _launch(_config(sft_moe, tmp_path / "bad", ep=3), 3, tmp_path, check=False)
    assert [code for code, _ in results] == [2, 2, 2], results
    first = results[0][1]
    assert "Traceback" not in first and len(first.strip().splitlines()) == 1, first[-2000:]
    assert "parallel.ep = 3 does not divide the number of experts (8)" in first
    assert all(not out.strip() for _, out in results[1:]), results
