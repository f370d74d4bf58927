"""A sharded RL run with a vLLM engine synced straight from the shards, on one device.

``cadenza train`` with ``CADENZA_FORCE_SHARDING=1`` (the policy, teacher and reference on FSDP2 / the dual
mesh in a one-rank group), a random-init tiny Qwen3-MoE on toolworld, Muon, ``engine = "vllm"`` and
``rollout.sync_probe_tol`` set, so every sync is checked (tensor names, and one probe sequence scored by
engine and trainer). ``--device cuda`` uses vLLM's native CUDA-IPC transfer (``weight_transfer = "ipc"``,
the engine on the same GPU; ``bench/gpu_sharded_rl.sh`` installs and runs it); ``--device cpu`` is its
CPU analogue (the worker-extension transfer; ``tests/integration/rl/test_gpu_sharded_script.py``).

Prints ONE JSON object: per-step sync seconds, reward and losses, whether every step trained, the commit
and the load average. Exit 1 (with the run's last output lines) when the run fails.
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
sys.path.insert(0, str(ROOT))


def _tokenizer(out: Path) -> Path:
    """A local tokenizer with the chat template, trained on toolworld transcripts (nothing downloaded)."""
    from cadenza.experiments.corpus import corpus
    from cadenza.rl.text.chat import train_tokenizer

    texts = [str(m.get("content") or "") for t in corpus(seed=7, n=200) for m in t]
    texts += ["system\n", "user\n", "assistant\n", "tool\n"] * 20
    tok = train_tokenizer(texts, vocab_size=512)
    tok.save_pretrained(str(out))
    return out


def config(out: Path, device: str, steps: int) -> dict:
    """The run's TOML table (as a dict): tiny MoE, toolworld, Muon, vllm engine with the sync checks."""
    from cadenza.rl.config import EnvConfig, ModelConfig, OptimConfig, RolloutConfig, RunConfig, TrainConfig

    transfer = {"weight_transfer": "ipc", "gpu_memory_utilization": 0.3} if device == "cuda" else {}
    cfg = TrainConfig(
        run=RunConfig(out_dir=str(out / "run"), steps=steps, seed=3, progress=False, threads=1),
        model=ModelConfig(
            tokenizer=str(_tokenizer(out / "tokenizer")),
            arch="qwen3_moe",
            hidden_size=64,
            num_heads=2,
            num_kv_heads=1,
            intermediate_size=32,
            num_experts=8,
            device=device,
        ),
        env=EnvConfig(name="toolworld", options={"min_steps": 1, "max_steps": 1, "extra_turns": 1}),
        rollout=RolloutConfig(
            group_size=4,
            tasks_per_step=2,
            max_new_tokens=24,
            max_turns=3,
            engine="vllm",
            engine_timeout_s=600,
            sync_probe_tol=1e-3,
            engine_options={"max_model_len": 1024, "kv_cache_gib": 1, "port": 0, **transfer},
        ),
        optim=OptimConfig(name="muon", muon_ns_dtype="float32", microbatch=4),
    )
    cfg.probe.every = 0  # nothing needs an unsharded copy: the engine syncs from the shards
    cfg.loss.lambda_sd = 1.0
    return cfg.to_dict()


def main() -> None:
    import tomli_w

    parser = argparse.ArgumentParser()
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--out", default="")
    parser.add_argument("--timeout-s", type=float, default=1800.0)
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="cadenza-sharded-rl-"))
    out.mkdir(parents=True, exist_ok=True)
    toml = out / "train.toml"
    toml.write_text(tomli_w.dumps(config(out, args.device, args.steps)))
    env = {**os.environ, "CADENZA_FORCE_SHARDING": "1", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "cadenza", "train", str(toml)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout_s)
    rows = [json.loads(x) for x in (out / "run" / "metrics.jsonl").read_text().splitlines()] if (
        out / "run" / "metrics.jsonl").exists() else []  # fmt: skip
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True, timeout=30).stdout.strip()  # fmt: skip
    result = {
        "device": args.device,
        "weight_transfer": "ipc" if args.device == "cuda" else "worker",
        "returncode": proc.returncode,
        "steps": [r["step"] for r in rows],
        "trained": all(not r["skipped_update"] for r in rows) and len(rows) == args.steps,
        "sync_s": [round(r["sync_s"], 3) for r in rows],
        "reward": [r["reward"] for r in rows],
        "grpo_loss": [r["grpo_loss"] for r in rows],
        "sd_loss": [r["sd_loss"] for r in rows],
        "commit": commit,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "out": str(out),
    }
    print(json.dumps(result))
    if proc.returncode != 0:
        sys.stderr.write((proc.stdout + proc.stderr)[-4000:])
        sys.exit(1)


if __name__ == "__main__":
    main()
