#!/usr/bin/env bash
# The SmolLM2 tool-hint setting, round 2 (docs/experiments.md, sections 5 and 9.2) at the size a GPU
# allows: arms grpo, grpo_turn (per-turn penalty: a signal where GRPO's rewards are all 0), grpo_sd,
# placebo; 5 seeds, every layer trains, 256 gap tasks, 64 held-out tasks, 60 steps of 4 tasks x 8
# samples, 48 new tokens. Not yet run (no GPU was lent to the session that wrote it).
# Resumable: rerun with the same OUT_DIR. Usage: bash bench/gpu_smol_tools.sh OUT_DIR
# Prints one JSON object (the comparison) at the end; results.json, summary.md, curves.png go to OUT_DIR.
set -euo pipefail
OUT="${1:?usage: bash bench/gpu_smol_tools.sh OUT_DIR}"
PY="${PYTHON:-.venv/bin/python}"
"$PY" - "$OUT" <<'PY'
import json, sys

from cadenza.experiments.smol_tools import SMOL_ARMS, SmolConfig, run_smol

exp = SmolConfig(
    arms=list(SMOL_ARMS),  # grpo, grpo_turn, grpo_sd, placebo
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
                  "comparison": res["comparison"], "wall_s": res["wall_s"], "code": res["code"],
                  "settings_digest": res["settings_digest"]}))
PY
