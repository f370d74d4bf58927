"""Benchmark asynchronous training: RL steps per minute at ``max_staleness`` 0, 1 and 2.

Same task mix for every K (toolworld, fixed seed), same tiny Qwen3 (briefly fine-tuned here on
toolworld's call format so episodes are multi-turn and hints drive real SD updates), one torch thread
per side (the trainer's and the rollout thread's), the in-process ``hf`` engine with real weight
syncs. The model size and turn length are chosen so that generation and training take comparable
time at K = 0 (``generate_s`` vs ``train_s`` in the output): that is where overlapping them pays.

Step 1 of each run is warm-up (engine start-up; nothing to overlap yet) and is not counted.
Prints ONE JSON object: ``{"steps_per_min": {"0": x, "1": y, "2": z}, "speedup": {...}, ...}``.
:func:`steps_per_min` is what ``bench/rollout.py`` calls. Usage: ``python bench/async_steps.py [--steps N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch


def _tiny_model(out: Path) -> Path:
    """A tiny Qwen3 that speaks toolworld's call format (a few seconds of SFT on generated transcripts)."""
    from cadenza.experiments.warmup import warm_up_toolworld_model

    warm_up_toolworld_model(out, sft_steps=40, hidden_size=128, intermediate_size=256, head_dim=32)
    return out


def _config(model: Path, out: Path, steps: int, k: int) -> Any:
    from cadenza.rl.config import (
        EnvConfig,
        LossConfig,
        ModelConfig,
        OptimConfig,
        RolloutConfig,
        RunConfig,
        TrainConfig,
    )

    return TrainConfig(
        run=RunConfig(out_dir=str(out), steps=steps, seed=3, progress=False, threads=1, measure_kl=False),
        model=ModelConfig(path=str(model)),
        env=EnvConfig(name="toolworld", options={"min_steps": 2, "max_steps": 2, "extra_turns": 1}),
        rollout=RolloutConfig(
            group_size=4, tasks_per_step=2, max_new_tokens=24, max_turns=3, max_staleness=k
        ),
        loss=LossConfig(lambda_sd=1.0),
        optim=OptimConfig(lr=1e-3, microbatch=2),
    )


def steps_per_min(
    steps: int = 6, staleness: tuple[int, ...] = (0, 1, 2), workdir: str | Path | None = None
) -> dict[str, Any]:
    """RL steps per minute for each K on the same task mix, plus the K = 0 generate/train split."""
    from cadenza.rl.train.trainer import Trainer

    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        root = Path(tmp)
        torch.set_num_threads(1)
        model = _tiny_model(root / "model")
        result: dict[str, Any] = {"steps_per_min": {}, "steps": steps}
        for k in staleness:
            rows = Trainer(_config(model, root / f"k{k}", steps + 1, k), resume=False).train()
            rows = rows[1:]  # step 1 is warm-up (engine start, nothing to overlap yet)
            wall = sum(r["step_s"] for r in rows)  # the loop's time per step, rollouts waited for included
            result["steps_per_min"][str(k)] = round(60.0 * steps / wall, 2)
            if k == 0:
                gen = sum(r["generate_s"] for r in rows) / steps
                train = sum(r["step_s"] - r["rollout_s"] - r["sync_s"] for r in rows) / steps
                result["k0_generate_s"] = round(gen, 3)
                result["k0_train_s"] = round(train, 3)
            result.setdefault("staleness_mean", {})[str(k)] = round(
                sum(r["staleness_mean"] for r in rows) / steps, 3
            )
            result.setdefault("sync_s", {})[str(k)] = round(sum(r["sync_s"] for r in rows) / steps, 4)
        torch.set_num_threads(threads)
    base = result["steps_per_min"].get("0")
    if base:
        result["speedup"] = {k: round(v / base, 2) for k, v in result["steps_per_min"].items()}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="RL steps per K")
    args = parser.parse_args()
    print(json.dumps(steps_per_min(steps=args.steps)))


if __name__ == "__main__":
    main()
