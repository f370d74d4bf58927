"""``cadenza pretrain``: a run killed mid-way at world 4 resumes at world 2 with the losses of an
uninterrupted run (itself at world 1), from sharded DCP checkpoints; bad input fails cleanly."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.pretrain_fixtures import train_tokenizer, write_corpus, write_model

ROOT = Path(__file__).resolve().parents[3]
STEPS = 6


def _config(
    tmp: Path,
    name: str,
    *,
    out: str,
    model: str = "qwen",
    dp_shard: int = -1,
    cp: int = 1,
    ep: int = 1,
    micro_batch: int = 0,
    files: list[Path],
) -> Path:
    listed = ", ".join(json.dumps(str(f)) for f in files)
    text = f"""
[model]
path = "{model}"
[data]
files = [{listed}]
seq_len = 16
[parallel]
dp_shard = {dp_shard}
cp = {cp}
ep = {ep}
[train]
steps = {STEPS}
global_batch = 4
micro_batch = {micro_batch}
lr = 5e-3
warmup_steps = 1
schedule = "wsd"
[checkpoint]
every = 2
keep = 3
[output]
dir = "{out}"
progress = false
"""
    path = tmp / name
    path.write_text(text)
    return path


def _torchrun(n: int, config: Path, **kw) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={n}",
        "-m",
        "cadenza",
        "pretrain",
        str(config),
    ]
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw
    )


def _kill_tree(pid: int) -> None:
    """SIGKILL torchrun and its workers (each worker runs in its own session, so not via killpg)."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    kids = [int(c) for c in children.read_text().split()] if children.exists() else []
    for kid in kids:
        _kill_tree(kid)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _losses(path: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, path.read_text().splitlines())}


@pytest.mark.slow
def test_kill_and_resume_on_another_world_size(tmp_path: Path) -> None:
    from cadenza.errors import ConfigError
    from cadenza.pretrain.config import load_config
    from cadenza.pretrain.loop import run

    files = write_corpus(tmp_path / "data")
    tok = train_tokenizer(files)
    write_model(tmp_path / "qwen", "qwen3_moe", tok)

    # Uninterrupted reference, in this process at world 1.
    ref = run(load_config(_config(tmp_path, "ref.toml", out="ref", files=files)))
    assert ref["start_step"] == 0 and ref["last"]["step"] == STEPS
    want = _losses(tmp_path / "ref" / "metrics.jsonl")

    # World 4 (FSDP 2 × CP 2, EP 2, two accumulated micro-batches of one sequence), SIGKILLed as soon
    # as its first checkpoint is complete.
    run4 = _config(tmp_path, "w4.toml", out="run", dp_shard=2, cp=2, ep=2, micro_batch=1, files=files)
    proc = _torchrun(4, run4)
    first = tmp_path / "run" / "checkpoints" / "step-00000002"
    deadline = time.monotonic() + 300
    while not (first / "meta.json").exists():
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "no checkpoint within 300 s"
        time.sleep(0.05)
    _kill_tree(proc.pid)
    proc.communicate()
    assert len(list(first.glob("*.distcp"))) == 4  # sharded: one file per rank
    assert json.loads((first / "meta.json").read_text())["world_size"] == 4

    # Resume at world 2 (FSDP 2, EP 2, no CP).
    run2 = _config(tmp_path, "w2.toml", out="run", dp_shard=2, ep=2, files=files)
    proc = _torchrun(2, run2)
    try:
        out, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        _kill_tree(proc.pid)
        raise AssertionError("resume hung:\n" + proc.communicate()[0][-5000:]) from None
    assert proc.returncode == 0, out[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert 2 <= summary["start_step"] < STEPS, summary
    metrics = tmp_path / "run" / "metrics.jsonl"
    got = _losses(metrics)
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == list(
        range(1, STEPS + 1)
    )
    for step in range(1, STEPS + 1):
        assert abs(got[step] - want[step]) / want[step] < 1e-4, (step, got[step], want[step])
    assert got[STEPS] < got[1]  # it trains

    # A checkpoint from another model is refused before anything runs.
    write_model(tmp_path / "dsv3", "deepseek_v3", tok)
    other = _config(tmp_path, "other.toml", out="run", model="dsv3", files=files)
    with pytest.raises(ConfigError, match="different model"):
        run(load_config(other))
