#!/usr/bin/env bash
# The SmolLM2 tool-hint setting (docs/experiments.md, section 5) at the size a GPU allows: 5 seeds,
# every layer trains, 256 gap tasks, 64 held-out tasks, 60 steps of 4 tasks x 8 samples, 48 new tokens.
# Not run on the 2-core CPU machine it was written on. Usage: bash bench/gpu_smol_tools.sh OUT_DIR
# Prints one JSON object (the comparison) at the end; results.json, summary.md, curves.png go to OUT_DIR.
set -euo pipefail
OUT="${1:?usage: bash bench/gpu_smol_tools.sh OUT_DIR}"
PY="${PYTHON:-.venv/bin/python}"
"$PY" - "$OUT" <<'PY'
import json, sys

from cadenza.experiments.smol_tools import SmolConfig, run_smol

exp = SmolConfig(
    seeds=[0, 1, 2, 3, 4],
    device="cuda",
    trainable_layers=0,  # every layer
    gap_tasks=256,
    steps=60,
    tasks_per_step=4,
    group_size=8,
    max_new_tokens=48,
    eval_every=5,
    heldout_tasks=64,
    probe_items=32,
    threads=4,
)
res = run_smol(sys.argv[1], exp, workers=1, log=lambda m: print(m, file=sys.stderr, flush=True))
print(json.dumps({"pre_rl": {k: res["pre_rl"][k] for k in ("valid_with_hint", "valid_without_hint")},
                  "comparison": res["comparison"], "wall_s": res["wall_s"]}))
PY
