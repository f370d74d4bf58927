"""Benchmark one RL training step (forward + backward): GRPO alone vs GRPO + per-turn self-distillation.

Prints ONE JSON object:
* ``tokens_per_s``: batch tokens / fastest wall-clock step (min over interleaved repeats; medians too), and
  ``tokens_per_cpu_s`` per CPU-second of this process, for GRPO only, GRPO+SD with the teacher reusing the
  student's KV cache (default), and GRPO+SD recomputing the whole hinted prefix; 1 model turn in 10 is
  hinted; ``sd_overhead_pct`` is the extra CPU time of SD (target: <= 30). CPU time is the primary
  measure because wall time on a shared 2-core machine mostly measures the neighbours;
  ``sd_overhead_pct_wall`` is reported too.
* ``peak_memory``: peak resident memory of one GRPO+SD step with chunked logits (``chunk_size``), with
  unchunked logits (``chunk_size=None``: all model-token logits at once) and with naive full
  ``model(...).logits`` (``[B, T, V]``). Measured as ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` in a
  fresh subprocess per variant, minus the resident size right before the step (CPU; torch has no CPU
  allocator peak counter). Ratios are what matter; absolute numbers depend on the allocator.

Usage: ``python bench/rl_step.py [--quick]``. Everything is local: tokenizer trained here, random-init model.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

from cadenza.agent.env import StepResult, ToolCall
from cadenza.feedback.hints import Hint
from cadenza.rl.config import TeacherConfig
from cadenza.rl.engines.policy import HFPolicy, Sample, SampleRequest, tiny_qwen3_config
from cadenza.rl.learn.losses import group_advantages, grpo_loss
from cadenza.rl.learn.step import rl_losses
from cadenza.rl.learn.teacher import Teacher, build_hinted_turns
from cadenza.rl.rollout.loop import RolloutParams, RolloutTask, rollout
from cadenza.rl.text.chat import train_tokenizer
from cadenza.rl.text.tokens import collate

WORDS = (
    "file",
    "test",
    "error",
    "value",
    "return",
    "import",
    "class",
    "def",
    "self",
    "path",
    "line",
    "fix",
    "assert",
    "module",
    "result",
    "count",
    "index",
    "print",
    "none",
    "true",
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run",
            "description": "run a shell command",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        },
    }
]


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


class ShellLikeEnv:
    """Observations of ``obs_words`` words per call; the episode length is set by ``max_turns``."""

    def __init__(self, seed: int, obs_words: int) -> None:
        self.rng, self.obs_words = random.Random(seed), obs_words

    def reset(self) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Fix the failing test. " + _text(self.rng, 60)},
        ]

    def tools(self) -> list[dict[str, Any]]:
        return TOOLS

    def step(self, call: ToolCall) -> StepResult:
        return StepResult(observation=_text(self.rng, self.obs_words), done=False)

    def finish(self) -> dict[str, Any]:
        return {"reward": self.rng.random(), "resolved": False}


class FillerPolicy:
    """Emits a short thought plus one ``run`` call per turn (stands in for a sampler; the step is what's
    timed)."""

    def __init__(self, tokenizer: Any, seed: int, words: int) -> None:
        self.tok, self.rng, self.words = tokenizer, random.Random(seed), words

    def sample(self, request: SampleRequest) -> list[Sample]:
        out = []
        for _ in request.prompts:
            call = json.dumps({"name": "run", "arguments": {"cmd": _text(self.rng, 4)}})
            text = f"{_text(self.rng, self.words)}\n<tool_call>\n{call}\n</tool_call>"
            ids = [*self.tok.encode(text, add_special_tokens=False), self.tok.eos_token_id]
            out.append(Sample(token_ids=ids, logprobs=[-2.0] * len(ids), finish_reason="stop"))
        return out


def build(args: argparse.Namespace) -> dict[str, Any]:
    corpus = [_text(random.Random(i), 50) for i in range(200)] + [json.dumps(TOOLS)] * 5
    tok = train_tokenizer(corpus, vocab_size=600)
    tasks = [
        RolloutTask(task_id=f"t{i}", make_env=lambda i=i: ShellLikeEnv(i, args.obs_words))
        for i in range(args.batch // 2)
    ]
    out = rollout(
        FillerPolicy(tok, 0, args.turn_words),
        tok,
        tasks,
        RolloutParams(group_size=2, max_turns=args.turns, max_context_tokens=100_000, max_new_tokens=256),
    )
    trajs = [r.tokens for r in out]
    # 1 model turn in 10 gets a hint (spread over the batch)
    hints = [
        [
            Hint(turn=t, text="Reminder: the available tools are run.", kind="bench")
            for t in range(len(tr.turn_spans))
            if (7 * b + t) % 10 == 3
        ]
        for b, tr in enumerate(trajs)
    ]
    config = tiny_qwen3_config(
        args.vocab,
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=args.hidden // 4,
    )
    policy = HFPolicy.from_config(config, seed=0)
    batch = collate(trajs, tok.pad_token_id)
    return dict(
        tok=tok,
        trajs=trajs,
        hints=hints,
        policy=policy,
        batch=batch,
        adv=group_advantages(batch.rewards, batch.group_ids),
        items=build_hinted_turns(trajs, hints, tok),
    )


def step(
    env: dict[str, Any], *, sd: bool, reuse_cache: bool = True, chunk_size: int | None = 1024
) -> tuple[float, float]:
    """One forward + backward; returns (wall seconds, CPU seconds of this process)."""
    policy = env["policy"]
    policy.model.zero_grad(set_to_none=True)
    teacher = Teacher(policy.model, TeacherConfig(reuse_prefix_cache=reuse_cache, chunk_size=chunk_size))
    w0, c0 = time.perf_counter(), time.process_time()
    res = rl_losses(
        policy,
        env["batch"],
        env["adv"],
        items=env["items"] if sd else (),
        teacher=teacher,
        chunk_size=chunk_size,
    )
    res.loss.backward()
    return time.perf_counter() - w0, time.process_time() - c0


def naive_step(env: dict[str, Any]) -> float:
    """Reference: HF's full ``[B, T, V]`` logits, then GRPO (no SD), to show what chunking avoids."""
    policy, batch = env["policy"], env["batch"]
    policy.model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    logits = policy.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()
    lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]
    lp = torch.cat([torch.zeros_like(lp[:, :1]), lp], 1)
    grpo_loss(lp, batch.behaviour_logprobs, env["adv"], batch.loss_mask).backward()
    return time.perf_counter() - t0


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def memory_worker(args: argparse.Namespace) -> None:
    args.vocab = args.mem_vocab
    env = build(args)
    before = _rss_mb()
    if args.worker == "naive_full_logits":
        naive_step(env)
    else:
        step(env, sd=True, chunk_size=None if args.worker == "unchunked" else args.chunk)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"variant": args.worker, "peak_delta_mb": round(peak - before, 1)}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller batch and fewer repeats")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--turn-words", type=int, default=30)
    ap.add_argument("--obs-words", type=int, default=60)
    ap.add_argument("--vocab", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--mem-vocab", type=int, default=32768, help="vocabulary for the memory variants")
    ap.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (1: stable CPU-time measure)"
    )
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.quick:
        args.batch, args.repeats, args.vocab, args.mem_vocab = 2, 3, 8192, 16384
    if args.worker:
        memory_worker(args)
        return
    torch.manual_seed(0)
    env = build(args)
    step(env, sd=True)  # warm-up
    variants = {
        "grpo": dict(sd=False),
        "grpo_sd_kv_reuse": dict(sd=True),
        "grpo_sd_no_reuse": dict(sd=True, reuse_cache=False),
    }
    wall: dict[str, list[float]] = {k: [] for k in variants}
    cpu: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.repeats):  # interleaved, so load changes on a shared machine hit all variants alike
        for name, kw in variants.items():
            w, c = step(env, chunk_size=args.chunk, **kw)
            wall[name].append(w)
            cpu[name].append(c)
    best = {k: min(v) for k, v in wall.items()}
    med = {k: statistics.median(v) for k, v in wall.items()}
    cpu_best = {k: min(v) for k, v in cpu.items()}
    n_tokens = int(env["batch"].attention_mask.sum())
    n_turns = sum(len(t.turn_spans) for t in env["trajs"])
    base = [sys.executable, __file__, *sys.argv[1:]]
    memory = {}
    for variant in ("chunked", "unchunked", "naive_full_logits"):
        proc = subprocess.run([*base, "--worker", variant], capture_output=True, text=True, check=True)
        memory[variant] = json.loads(proc.stdout.strip().splitlines()[-1])["peak_delta_mb"]
    overhead = 100 * (cpu_best["grpo_sd_kv_reuse"] / cpu_best["grpo"] - 1)
    print(
        json.dumps(
            {
                "bench": "rl_step",
                "setup": {
                    "batch": len(env["trajs"]),
                    "tokens": n_tokens,
                    "model_tokens": int(env["batch"].loss_mask.sum()),
                    "turns": n_turns,
                    "hinted_turns": len(env["items"]),
                    "hinted_target_tokens": sum(i.num_tokens for i in env["items"]),
                    "vocab": args.vocab,
                    "hidden": args.hidden,
                    "layers": 2,
                    "chunk_size": args.chunk,
                    "repeats": args.repeats,
                    "memory_vocab": args.mem_vocab,
                    "device": "cpu",
                    "threads": torch.get_num_threads(),
                },
                "step_wall_seconds_min": {k: round(v, 4) for k, v in best.items()},
                "step_wall_seconds_median": {k: round(v, 4) for k, v in med.items()},
                "step_cpu_seconds_min": {k: round(v, 4) for k, v in cpu_best.items()},
                "tokens_per_s": {k: round(n_tokens / v, 1) for k, v in best.items()},
                "tokens_per_cpu_s": {k: round(n_tokens / v, 1) for k, v in cpu_best.items()},
                "sd_overhead_pct": round(overhead, 1),
                "sd_overhead_pct_wall": round(100 * (best["grpo_sd_kv_reuse"] / best["grpo"] - 1), 1),
                "sd_overhead_pct_no_kv_reuse": round(
                    100 * (cpu_best["grpo_sd_no_reuse"] / cpu_best["grpo"] - 1), 1
                ),
                "target_sd_overhead_pct": 30.0,
                "target_met": overhead <= 30.0,
                "peak_memory": {
                    "method": "ru_maxrss minus RSS before the step, fresh subprocess per variant (CPU)",
                    "unit": "MiB",
                    **memory,
                },
            }
        )
    )


if __name__ == "__main__":
    main()
