"""A rank of a sharded ``cadenza train`` that dies mid-run ends the run with one line, and the newest
checkpoint resumes.

Two ranks (``[parallel] ep = 2``, tiny Qwen3-MoE, the ``hf`` engine) checkpoint every step; rank 1 is
SIGKILLed once the first checkpoint is published. Rank 0 must leave within the deadline (the collective
fails at once when the peer's sockets close, at the latest after ``run.collective_timeout_s``) with exit 1
and one line naming the cause and the newest checkpoint, no traceback; the same command then resumes
from that checkpoint and finishes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from cadenza.metrics import read_metrics
from cadenza.rl.config import ParallelDims, TrainConfig
from cadenza.rl.train.checkpoint import list_checkpoints
from tests.support.ranks import start_ranks
from tests.support.rl_fixtures import config

TIMEOUT_S = 60  # run.collective_timeout_s
DEADLINE_S = TIMEOUT_S + 60  # rank 0 must have left by then (a hang would be killed at 900 s)


def _config(model: Path, out: Path, steps: int) -> TrainConfig:
    cfg = config(model, out, steps=steps, lambda_sd=1.0)
    cfg.env.options = {"min_steps": 1, "max_steps": 1, "extra_turns": 1}
    cfg.run.checkpoint_every, cfg.run.keep_checkpoints = 1, 3
    cfg.run.collective_timeout_s = TIMEOUT_S
    cfg.probe.every = 0
    cfg.parallel = ParallelDims(ep=2)
    return cfg


def _start(cfg: TrainConfig, tmp: Path, world: int = 2) -> list[subprocess.Popen]:
    import tomli_w

    toml = tmp / "train.toml"
    toml.write_text(tomli_w.dumps(cfg.to_dict()))
    return start_ranks([sys.executable, "-m", "cadenza", "train", str(toml)], world, tmp)


def _kill(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            p.kill()


def test_a_killed_rank_ends_the_run_with_one_line_and_the_checkpoint_resumes(sft_moe, tmp_path):
    out = tmp_path / "run"
    procs = _start(_config(sft_moe, out, steps=6), tmp_path)
    try:
        deadline = time.monotonic() + 600
        while not list_checkpoints(out):
            assert all(p.poll() is None for p in procs), procs[0].communicate()[0][-3000:]
            assert time.monotonic() < deadline, "no checkpoint within 600 s"
            time.sleep(0.1)
        os.kill(procs[1].pid, signal.SIGKILL)  # mid-run: step 2's rollouts or update
        killed = time.monotonic()
        text = procs[0].communicate(timeout=DEADLINE_S)[0]
        waited = time.monotonic() - killed
    finally:
        _kill(procs)
    assert waited <= DEADLINE_S
    assert procs[0].returncode == 1, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    last = text.strip().splitlines()[-1]
    newest = list_checkpoints(out)[-1]
    assert last.startswith("error: rank 0: a collective failed"), last
    assert "another rank most likely died" in last and f"newest checkpoint: {newest}" in last, last

    # the newest checkpoint loads: the same command resumes from it and finishes one more step
    done = int(newest.name.split("-")[-1])
    procs = _start(_config(sft_moe, out, steps=done + 1), tmp_path)
    try:
        outs = [p.communicate(timeout=900)[0] for p in procs]
    finally:
        _kill(procs)
    assert all(p.returncode == 0 for p in procs), outs[0][-3000:] + outs[1][-3000:]
    assert f"done: step {done + 1}" in outs[0]
    assert read_metrics(out / "metrics.jsonl")[-1]["step"] == done + 1
