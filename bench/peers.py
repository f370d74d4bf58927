"""A peer side by side: TRL's ``GRPOTrainer`` and cadenza's GRPO step on the same model and the same work.

Both trainers load one HF directory (a tiny Qwen3 built here from a fixed config and seed, or
SmolLM2-135M with ``--model smollm2``), take the same prompts in the same order, sample ``--group-size``
completions of at most ``--max-new-tokens`` tokens per prompt at temperature 1, score them with the
same single-turn string reward (:func:`peers_common.vowel_reward`) and take one AdamW step (same lr,
betas, clip) in float32 on ``--threads`` torch threads. What each side does per step and how it is
configured to match the other is in ``bench/peers_trl.py`` and ``bench/peers_cadenza.py``.

Each side runs in its own process, TRL in its own venv (so the trainer's venv never gets TRL's
dependencies). The steps are interleaved: the parent lets one worker run one step, then the other
(alternating who goes first), so a change of load on the shared machine hits both alike. The first
``--warmup`` steps of each side are dropped; figures are medians over ``--steps``.

Prints ONE JSON object (also written to ``bench/results/peers.json`` with the git commit): per side the
median step, generation and update seconds, CPU seconds, tokens per step and trained (completion)
tokens per second; ``speedup_*`` = TRL's time / cadenza's (> 1: cadenza faster); ``target_met``:
cadenza's step at least as fast as TRL's.

Usage: ``python bench/peers.py [--install] [--model tiny|smollm2] [--steps N] ...``. Without the TRL venv
it says how to create it (``--install``: ``<venv>/trl``, or ``--trl-venv`` / ``$CADENZA_TRL_VENV``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from peers_common import Settings, compare, corpus, parse_line, summarise  # noqa: E402

TRL = "trl==1.16.0"
TORCH = "torch==2.13.0"
ENV_VAR = "CADENZA_TRL_VENV"


def default_venv() -> Path:
    """``$CADENZA_TRL_VENV``, else ``<this interpreter's venv>/trl`` (beside ``vllm`` and ``ecosystem``)."""
    return Path(os.environ.get(ENV_VAR) or Path(sys.prefix) / "trl")


def trl_python(venv: Path) -> str:
    """The TRL venv's python, or one line naming how to create it."""
    python = venv / "bin" / "python"
    if not python.exists():
        raise SystemExit(
            f"bench/peers.py: no TRL venv at {venv}; create it with: python bench/peers.py --install "
            f"--trl-venv {venv}   (a venv holding {TORCH} then {TRL})"
        )
    return str(python)


def install(venv: Path) -> None:
    """Create the TRL venv: the CPU torch wheel first (so no CUDA build is pulled in), then TRL."""
    py = venv / "bin" / "python"
    steps = [] if py.exists() else [[sys.executable, "-m", "venv", str(venv)]]
    steps += [[str(py), "-m", "pip", "install", "-q", spec] for spec in (TORCH, TRL)]
    steps.append(
        [str(py), "-c", "import trl, torch; print('trl', trl.__version__, 'torch', torch.__version__)"]
    )
    for cmd in steps:
        try:
            subprocess.run(cmd, check=True, timeout=1800)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            raise SystemExit(f"bench/peers.py --install: {' '.join(cmd[-3:])} failed ({exc})") from None


def tiny_model(out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """A tiny Qwen3 (fixed config, seed ``--seed``) and a tokenizer trained here, in one HF directory."""
    from cadenza.rl.engines.policy import HFPolicy, tiny_qwen3_config
    from cadenza.rl.text.chat import train_tokenizer

    tok = train_tokenizer(corpus(args.seed), vocab_size=args.vocab)
    config = tiny_qwen3_config(
        len(tok),
        hidden_size=args.hidden,
        intermediate_size=3 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=args.hidden // 4,
    )
    policy = HFPolicy.from_config(config, seed=args.seed)
    policy.model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return {"model": "tiny-qwen3", "vocab": len(tok), "hidden": args.hidden, "layers": args.layers}


def smollm2() -> tuple[Path, dict[str, Any]]:
    from cadenza.rl.models import ensure_smollm2

    path = ensure_smollm2()
    return path, {"model": "SmolLM2-135M-Instruct"}


class Worker:
    """One side's process: send ``go``, read its one protocol line, each with a deadline."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], log: Path, timeout_s: float) -> None:
        self.name, self.log, self.timeout_s = name, log, timeout_s
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True, env=env, cwd=ROOT
        )
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.proc.stdout, selectors.EVENT_READ)

    def read(self) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sel.select(timeout=left):
                self.fail(f"no answer within {self.timeout_s:g} s (--timeout)")
            line = self.proc.stdout.readline()
            if not line:
                self.fail(f"exited with code {self.proc.wait(timeout=30)}")
            obj = parse_line(line)
            if obj is not None:
                return obj

    def step(self) -> dict[str, Any]:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return self.read()

    def fail(self, why: str) -> None:
        self.close()
        tail = self.log.read_text()[-3000:]
        raise SystemExit(f"bench/peers.py: the {self.name} worker {why}; its log ({self.log}) ends:\n{tail}")

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(timeout=30)
        self._log.close()


def run(args: argparse.Namespace) -> dict[str, Any]:
    python_trl = trl_python(args.trl_venv)
    s = Settings(
        prompts_per_step=args.prompts,
        group_size=args.group_size,
        max_new_tokens=args.max_new_tokens,
        prompt_words=args.prompt_words,
        steps=args.steps,
        warmup=args.warmup,
        lr=args.lr,
        threads=args.threads,
        seed=args.seed,
    )
    try:
        s.check()
    except ValueError as exc:
        raise SystemExit(f"bench/peers.py: {exc}") from None
    with tempfile.TemporaryDirectory(prefix="peers_") as tmp:
        work = Path(tmp)
        if args.model == "smollm2":
            model_dir, model = smollm2()
        else:
            model_dir = work / "model"
            model = tiny_model(model_dir, args)
        s = dataclasses.replace(s, model_dir=str(model_dir))
        s.save(work / "settings.json")
        base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env = {**base, "OMP_NUM_THREADS": str(s.threads), "MKL_NUM_THREADS": str(s.threads),
               "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(work / "hf"), "CUDA_VISIBLE_DEVICES": "",
               "WANDB_DISABLED": "true", "PYTHONUNBUFFERED": "1"}  # fmt: skip
        here, cfg = Path(__file__).parent, str(work / "settings.json")
        workers = {
            "trl": Worker("trl", [python_trl, str(here / "peers_trl.py"), cfg], env,
                          work / "trl.log", args.timeout),
            "cadenza": Worker("cadenza", [sys.executable, str(here / "peers_cadenza.py"), cfg],
                              {**env, "PYTHONPATH": str(ROOT)}, work / "cadenza.log", args.timeout),
        }  # fmt: skip
        try:
            ready = {name: w.read() for name, w in workers.items()}
            rows: dict[str, list[dict[str, Any]]] = {name: [] for name in workers}
            for k in range(s.total_steps):  # interleaved; who goes first alternates
                order = ["trl", "cadenza"] if k % 2 == 0 else ["cadenza", "trl"]
                for name in order:
                    rows[name].append(workers[name].step())
        finally:
            for w in workers.values():
                w.close()
    sides = {name: summarise(r, s.warmup) for name, r in rows.items()}
    from cadenza.experiments.provenance import code_version

    return {
        "bench": "peers",
        **code_version(),
        "setup": {
            **model,
            "params": ready["cadenza"]["params"],
            "prompts_per_step": s.prompts_per_step,
            "group_size": s.group_size,
            "completions_per_step": s.prompts_per_step * s.group_size,
            "max_new_tokens": s.max_new_tokens,
            "prompt_words": s.prompt_words,
            "steps_measured": s.steps,
            "warmup_steps": s.warmup,
            "interleaved": True,
            "threads": s.threads,
            "dtype": "float32",
            "optimizer": f"AdamW lr {s.lr:g} betas {s.betas} eps 1e-8 wd 0, constant lr, clip {s.grad_clip}",
            "optimizer_class": {n: r[-1]["optimizer"] for n, r in rows.items()},
            "loss": f"GRPO token-mean clipped surrogate (eps {s.clip_eps:g}), group-std advantages, no KL",
            "reward": "vowel fraction of the completion text (peers_common.vowel_reward)",
            "gradient_checkpointing": {"trl": ready["trl"]["gradient_checkpointing"], "cadenza": False},
            "device": "cpu",
            "versions": {**ready["trl"]["versions"], "cadenza_torch": ready["cadenza"]["versions"]["torch"]},
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        },
        "trl": sides["trl"],
        "cadenza": sides["cadenza"],
        **compare(sides["trl"], sides["cadenza"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--install", action="store_true", help="create the TRL venv and exit")
    ap.add_argument("--trl-venv", type=Path, default=default_venv(), help="the TRL venv ($CADENZA_TRL_VENV)")
    ap.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    ap.add_argument("--vocab", type=int, default=4096, help="tiny model: tokenizer/model vocabulary")
    ap.add_argument("--hidden", type=int, default=256, help="tiny model: width")
    ap.add_argument("--layers", type=int, default=4, help="tiny model: decoder layers")
    ap.add_argument("--prompts", type=int, default=4, help="distinct prompts per step")
    ap.add_argument("--group-size", type=int, default=4, help="completions per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--prompt-words", type=int, default=24)
    ap.add_argument("--steps", type=int, default=8, help="measured steps per side")
    ap.add_argument("--warmup", type=int, default=1, help="uncounted leading steps per side")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--timeout", type=float, default=900.0, help="seconds a worker may take per step or start"
    )
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "peers.json")
    args = ap.parse_args()
    if args.install:
        install(args.trl_venv)
        return
    result = run(args)
    print(json.dumps(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
