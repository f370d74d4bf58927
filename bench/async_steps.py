"""Benchmark asynchronous training: RL steps per minute at ``max_staleness`` 0, 1 and 2.

Same task mix for every K (toolworld, fixed seed), same tiny Qwen3 (briefly fine-tuned here on
toolworld's call format so episodes are multi-turn and hints drive real SD updates), one torch thread
per side (the trainer's and the rollout thread's), the in-process ``hf`` engine with real weight
syncs. The model size and turn length are chosen so that generation and training take comparable
time at K = 0 (``generate_s`` vs ``train_s`` in the output): that is where overlapping them pays.

Step 1 of each run is warm-up (engine start-up; nothing to overlap yet) and is not counted.
Prints ONE JSON object: ``{"steps_per_min": {"0": x, "1": y, "2": z, "1p": .., "2p": ..}, ...}`` (``p``:
with partial rollouts, ``rollout.partial_rollouts``; ``k2_over_k1_partial``: the ratio the issue targets).
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


def _config(model: Path, out: Path, steps: int, k: int, partial: bool = False) -> Any:
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
            group_size=4,
            tasks_per_step=2,
            max_new_tokens=24,
            max_turns=3,
            max_staleness=k,
            partial_rollouts=partial,
        ),
        loss=LossConfig(lambda_sd=1.0),
        optim=OptimConfig(lr=1e-3, microbatch=2),
    )


def steps_per_min(
    steps: int = 6,
    staleness: tuple[str, ...] = ("0", "1", "2", "1p", "2p"),
    workdir: str | Path | None = None,
) -> dict[str, Any]:
    """RL steps per minute for each K on the same task mix, plus the K = 0 generate/train split.

    ``"Kp"``: K with partial rollouts (a sync lands between batches of the rollout in progress)."""
    from cadenza.rl.train.trainer import Trainer

    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        root = Path(tmp)
        torch.set_num_threads(1)
        model = _tiny_model(root / "model")
        result: dict[str, Any] = {"steps_per_min": {}, "steps": steps}
        for key in staleness:
            k, partial = int(key.rstrip("p")), key.endswith("p")
            cfg = _config(model, root / f"k{key}", steps + 1, k, partial)
            rows = Trainer(cfg, resume=False).train()
            rows = rows[1:]  # step 1 is warm-up (engine start, nothing to overlap yet)
            wall = sum(r["step_s"] for r in rows)  # the loop's time per step, rollouts waited for included
            result["steps_per_min"][key] = round(60.0 * steps / wall, 2)
            if key == "0":
                gen = sum(r["generate_s"] for r in rows) / steps
                train = sum(r["step_s"] - r["rollout_s"] - r["sync_s"] for r in rows) / steps
                result["k0_generate_s"] = round(gen, 3)
                result["k0_train_s"] = round(train, 3)
            result.setdefault("staleness_mean", {})[key] = round(
                sum(r["staleness_mean"] for r in rows) / steps, 3
            )
            result.setdefault("sync_s", {})[key] = round(sum(r["sync_s"] for r in rows) / steps, 4)
        torch.set_num_threads(threads)
    base = result["steps_per_min"].get("0")
    if base:
        result["speedup"] = {k: round(v / base, 2) for k, v in result["steps_per_min"].items()}
    spm = result["steps_per_min"]
    if "2p" in spm and "1p" in spm:  # the target: K = 2 at least 10% above K = 1, with partial
        result["k2_over_k1_partial"] = round(spm["2p"] / spm["1p"], 3)
        result["k2_over_k1_partial_ok"] = spm["2p"] >= 1.1 * spm["1p"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="RL steps per K")
    parser.add_argument("--out", type=Path, default=None, help="Also write the JSON here")
    args = parser.parse_args()
    from cadenza.experiments.provenance import code_version

    result = steps_per_min(steps=args.steps)
    result.update(loadavg_1m=round(os.getloadavg()[0], 2), cpus=os.cpu_count(), code=code_version())
    print(json.dumps(result))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
