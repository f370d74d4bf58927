"""wandb as a third sink of the one metrics logger: `cadenza train` with `[run] wandb = true` in offline
mode (no network) writes a wandb run whose history holds the rows of metrics.jsonl; without the wandb
package the config is refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cadenza.metrics import read_metrics
from tests.support.rl_fixtures import config

BLOCK_WANDB = """
import importlib.abc, sys
class _NoWandb(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "wandb":
            raise ModuleNotFoundError("No module named 'wandb'", name=name)
sys.meta_path.insert(0, _NoWandb())
from cadenza.cli import main
sys.argv = ["cadenza", *sys.argv[1:]]
main()
"""


def _write(cfg, path: Path) -> Path:
    import tomli_w

    path.write_text(tomli_w.dumps(cfg.to_dict()))
    return path


def _records(path: Path) -> list[bytes]:
    """The records of a ``.wandb`` file: a 7-byte header, then LevelDB-log records (crc, length, type)
    in 32 KiB blocks; types 1 full, 2 first, 3 middle, 4 last (wandb's datastore format)."""
    data, pos, block, out, part = path.read_bytes(), 7, 32768, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # the block's tail is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        part = chunk if kind in (1, 2) else part + chunk
        if kind in (1, 4):
            out.append(part)
    return out


def _history(run_dir: Path) -> list[dict]:
    """The history rows of a wandb run file, decoded with wandb's own protobuf schema."""
    from wandb.proto import wandb_internal_pb2 as pb

    rows = []
    for data in _records(next(run_dir.glob("run-*.wandb"))):
        rec = pb.Record()
        rec.ParseFromString(data)
        if rec.WhichOneof("record_type") == "history":
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
    return rows


def test_train_logs_to_wandb_offline(sft_model: Path, tmp_path: Path) -> None:
    cfg = config(sft_model, tmp_path / "run", steps=2)
    cfg.run.wandb, cfg.run.wandb_project = True, "cadenza-test"
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DISABLE_GIT": "true"}
    toml = _write(cfg, tmp_path / "train.toml")
    proc = subprocess.run(
        [sys.executable, "-m", "cadenza", "train", str(toml)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, list((tmp_path / "run").rglob("*"))[:20]
    history = _history(runs[0])
    assert [h["_step"] for h in history] == [r["step"] for r in rows] == [1, 2]
    for h, r in zip(history, rows, strict=True):
        for key in ("reward", "grpo_loss", "valid_call_rate", "episodes"):
            assert h[key] == pytest.approx(r[key]), key


def test_wandb_not_installed_is_one_line(sft_model: Path, tmp_path: Path) -> None:
    cfg = config(sft_model, tmp_path / "run", steps=1)
    cfg.run.wandb = True
    toml = _write(cfg, tmp_path / "train.toml")
    proc = subprocess.run(
        [sys.executable, "-c", BLOCK_WANDB, "train", str(toml)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "wandb package is not installed" in proc.stderr and "cadenza[wandb]" in proc.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
