"""Refactoring gate: fixed-seed metrics of a trainer run (K = 0 and K = 1) and of a pretraining run.

A move of modules (issue #26's re-layout) must leave these bit-identical. Everything runs through the CLI
(``python -m cadenza train|pretrain``) so the script itself imports no module that a move relocates:

    python bench/bitwise_gate.py --record /tmp/gate-before.json   # on the old layout
    python bench/bitwise_gate.py --check /tmp/gate-before.json    # on the new one: exit 1 on any difference

Prints one JSON object: the metric rows (wall-time keys removed) of each run and whether they matched.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMING = {"tokens_per_s", "rollout_s", "step_s", "generate_s", "sync_s", "time_s", "elapsed_s", "seconds"}

TRAIN = """
[run]
out_dir = "{out}"
steps = 3
seed = 3
checkpoint_every = 2
progress = false
threads = 1
[model]
path = "{model}"
[env]
name = "toolworld"
[env.options]
min_steps = 2
max_steps = 2
extra_turns = 1
[rollout]
group_size = 4
tasks_per_step = 2
max_new_tokens = 24
max_turns = 3
max_staleness = {k}
[loss]
lambda_sd = 1.0
top_k = 4
[optim]
lr = 3e-3
microbatch = 4
"""

PRETRAIN = """
[model]
path = "{model}"
[data]
files = [{files}]
seq_len = 16
[train]
steps = 4
global_batch = 4
lr = 5e-3
warmup_steps = 1
schedule = "wsd"
optimizer = "muon"
[muon]
granular = true
[checkpoint]
every = 100
[output]
dir = "{out}"
progress = false
"""


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _cli(*args: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "cadenza", *args],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0:
        raise SystemExit(f"cadenza {' '.join(args)} failed:\n{proc.stderr[-3000:]}")


def _strip(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def _rows(path: Path) -> list[dict]:
    return _strip([json.loads(line) for line in path.read_text().splitlines() if line.strip()])


def _helper(code: str) -> None:
    """Run fixture code (tests/support, cadenza.experiments) in a fresh interpreter."""
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900
    )
    if proc.returncode != 0:
        raise SystemExit(f"fixture failed:\n{proc.stderr[-3000:]}")


def measure(tmp: Path) -> dict:
    sft = tmp / "sft"
    _helper(
        "from cadenza.experiments.warmup import warm_up_toolworld_model as w; import torch; "
        "torch.set_num_threads(1); "
        f"w({str(sft)!r}, hidden_size=32, intermediate_size=64, head_dim=8)"
    )
    out: dict = {}
    for k in (0, 1):
        toml = tmp / f"train{k}.toml"
        toml.write_text(TRAIN.format(out=tmp / f"rl{k}", model=sft, k=k))
        _cli("train", str(toml))
        out[f"train_k{k}"] = _rows(tmp / f"rl{k}" / "metrics.jsonl")
    _helper(
        "from pathlib import Path; "
        "from tests.support.pretrain_fixtures import train_tokenizer, write_corpus, write_model; "
        f"files = write_corpus(Path({str(tmp / 'corpus')!r})); "
        f"write_model(Path({str(tmp / 'moe')!r}), 'qwen3_moe', train_tokenizer(files))"
    )
    files = ", ".join(json.dumps(str(f)) for f in sorted((tmp / "corpus").iterdir()))
    toml = tmp / "pretrain.toml"
    toml.write_text(PRETRAIN.format(model=tmp / "moe", files=files, out=tmp / "pt"))
    _cli("pretrain", str(toml))
    out["pretrain"] = _rows(tmp / "pt" / "metrics.jsonl")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", type=Path, help="write the measured metrics here")
    ap.add_argument("--check", type=Path, help="compare with metrics recorded earlier; exit 1 if any differ")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="cadenza-gate-") as tmp:
        runs = measure(Path(tmp))
    if args.record:
        args.record.write_text(json.dumps(runs, indent=1, sort_keys=True))
    result: dict = {"runs": {k: len(v) for k, v in runs.items()}}
    if args.check:
        before = json.loads(args.check.read_text())
        result["identical"] = {k: _strip(before.get(k, [])) == _strip(v) for k, v in runs.items()}
    print(json.dumps(result, sort_keys=True))
    if args.check and not all(result["identical"].values()):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
