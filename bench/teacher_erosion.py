"""Teacher erosion under stress: the same GRPO + SD run with each teacher, the hint-following diagnostic
logged.

A stress test, not the pre-registered experiment: a high learning rate (default 2e-3, 4x the
experiment's) makes a live teacher's erosion show within a few dozen steps. Prints one JSON object: per
teacher, the teacher's and student's P(correct call | hint) and P(correct call | no hint) on the probe at
the first and last measurement, the lowest teacher value, and the last steps' training valid-call rate.

    python bench/teacher_erosion.py --model runs/tool-hints/sft-seed0 --steps 30
    (without --model a warm-up model is trained first: corpus 1000, SFT 300 steps, ~2 CPU-minutes)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cadenza.experiments.study import _corpus
from cadenza.experiments.tool_hints import ExperimentConfig, build_tokenizer, sft_model, train_config
from cadenza.metrics import read_metrics
from cadenza.rl.learn.sft import encode_messages

TEACHERS = {"frozen": "grpo_sd", "ema": "sd_ema", "snapshot": "sd_snapshot", "live": "sd_live"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="", help="an SFT model directory of the tool-hint experiment")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--teachers", default=",".join(TEACHERS))
    args = ap.parse_args()
    import torch
    from transformers.utils import logging as hf_logging

    from cadenza.rl.train.trainer import Trainer

    torch.set_num_threads(1)
    hf_logging.disable_progress_bar()
    exp = ExperimentConfig.quick()
    exp.rl_lr, exp.eval_every = args.lr, 5
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(args.model) if args.model else None
        if model is None:
            tok = build_tokenizer(exp, _corpus(exp), Path(tmp) / "tok")
            data = [encode_messages(tok, m) for m in _corpus(exp, tok)]
            model = sft_model(exp, args.seed, tok, data, Path(tmp) / "sft", lambda m: None)
        out = {
            "lr": args.lr,
            "steps": args.steps,
            "seed": args.seed,
            "model": str(args.model or "fresh quick SFT"),
        }
        for name in args.teachers.split(","):
            run = Path(tmp) / name
            Trainer(train_config(exp, TEACHERS[name], args.seed, model, run, args.steps)).train()
            rows = read_metrics(run / "metrics.jsonl")
            probe = [r for r in rows if r.get("probe_teacher_hinted") is not None]
            first, last = probe[0], probe[-1]
            keys = ("probe_teacher_hinted", "probe_student_hinted", "probe_student_unhinted")
            out[name] = {
                **{f"first_{k[6:]}": round(first[k], 4) for k in keys},
                **{f"last_{k[6:]}": round(last[k], 4) for k in keys},
                "min_teacher_hinted": round(min(r["probe_teacher_hinted"] for r in probe), 4),
                "last5_valid_call_rate": round(
                    sum(r["valid_call_rate"] for r in rows[-5:]) / len(rows[-5:]), 4
                ),
                "curve_teacher_hinted": [round(r["probe_teacher_hinted"], 4) for r in probe],
            }
    out["wall_s"] = round(time.time() - t0, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
