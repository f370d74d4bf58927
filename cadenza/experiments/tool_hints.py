"""The tool-hint experiment: does a hint at the faulty turn (self-distillation) fix tool choice with
fewer episodes than GRPO alone?

Pipeline (all on CPU, seeds fixed and listed in the outputs):
1. an SFT corpus of toolworld transcripts (:mod:`cadenza.experiments.corpus`) and a tokenizer trained on it;
2. per seed, a tiny random-init Qwen3 fine-tuned on the corpus; the pre-RL gap
   P(valid tool | tool list in context) vs P(valid tool | no list) is measured on held-out tasks;
3. four arms from that same starting point, with equal episode budgets, each run by the ordinary
   trainer (:class:`cadenza.rl.trainer.Trainer`): GRPO alone; GRPO + SD with the tool-list hint
   (full-vocabulary reverse KL); the same with top-k; GRPO + SD with a placebo hint of the same length;
4. ``results.json``, ``summary.md`` and ``curves.png`` in the output directory.

Every knob below was fixed before any arm was compared (see README, Honesty).
"""

from __future__ import annotations

import dataclasses
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cadenza.errors import CadenzaError
from cadenza.experiments import report
from cadenza.experiments.corpus import corpus, tool_list_hint
from cadenza.experiments.toolworld import PROFILES, ToolworldConfig, ToolworldEnv, sample_task
from cadenza.jsonio import atomic_write_json, atomic_write_text


@dataclass(kw_only=True)
class ExperimentConfig:
    """Fixed before any arm was compared; ``--quick`` only shrinks seeds, corpus and budgets."""

    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    corpus_size: int = 2000
    corpus_seed: int = 12345
    vocab_size: int = 512
    sft_steps: int = 400
    sft_batch: int = 16
    sft_lr: float = 3e-3
    gap_tasks: int = 256
    rl_steps: int = 30
    tasks_per_step: int = 4
    group_size: int = 8
    rl_lr: float = 3e-4
    lambda_sd: float = 1.0
    top_k: int = 8
    temperature: float = 1.0
    max_new_tokens: int = 32
    hidden_size: int = 64
    num_layers: int = 2
    window: int = 3
    threads: int = 1  # tiny models are overhead-bound; one thread avoids OpenMP contention on shared CPUs

    @classmethod
    def quick(cls) -> ExperimentConfig:
        return cls(seeds=[0], corpus_size=1000, sft_steps=300, gap_tasks=128, rl_steps=8)

    @property
    def episodes_per_step(self) -> int:
        return self.tasks_per_step * self.group_size


ARM_SETTINGS: dict[str, dict[str, Any]] = {
    "grpo": {"lambda_sd": 0.0, "top_k": 0, "placebo": False},
    "grpo_sd": {"lambda_sd": None, "top_k": 0, "placebo": False},
    "grpo_sd_topk": {"lambda_sd": None, "top_k": None, "placebo": False},
    "placebo": {"lambda_sd": None, "top_k": 0, "placebo": True},
}


def train_config(exp: ExperimentConfig, arm: str, seed: int, model_dir: Path, out_dir: Path) -> Any:
    """The trainer config of one (arm, seed): only the loss weight, top-k and placebo flag differ."""
    from cadenza.feedback.generate import FeedbackConfig
    from cadenza.rl.config import (
        EnvConfig,
        LossConfig,
        ModelConfig,
        OptimConfig,
        RolloutConfig,
        RunConfig,
        TrainConfig,
    )

    s = ARM_SETTINGS[arm]
    lam = exp.lambda_sd if s["lambda_sd"] is None else s["lambda_sd"]
    top_k = exp.top_k if s["top_k"] is None else s["top_k"]
    return TrainConfig(
        run=RunConfig(
            out_dir=str(out_dir),
            steps=exp.rl_steps,
            seed=seed,
            checkpoint_every=0,
            progress=False,
            threads=exp.threads,
            measure_kl=True,
            monitor="off",
        ),  # no workspace, nothing to hack
        model=ModelConfig(path=str(model_dir), tokenizer=str(model_dir)),
        env=EnvConfig(name="toolworld", options={}),
        rollout=RolloutConfig(
            group_size=exp.group_size,
            tasks_per_step=exp.tasks_per_step,
            max_new_tokens=exp.max_new_tokens,
            temperature=exp.temperature,
            max_turns=ToolworldConfig().max_steps + ToolworldConfig().extra_turns,
        ),
        loss=LossConfig(lambda_sd=lam, top_k=top_k, divergence="reverse_kl"),
        optim=OptimConfig(lr=exp.rl_lr),
        feedback=FeedbackConfig(kinds=["tool_not_found"] if lam > 0 else [], placebo=s["placebo"]),
    )


# Fixed pieces of the tool-call JSON as single tokens: a byte-level BPE trained on this tiny corpus
# cannot merge across its pre-tokenizer's punctuation splits, and half of every turn would be glue.
CALL_PIECES = ('{"name": "', '", "arguments": ', '{"path": "', '"}}')


def build_tokenizer(exp: ExperimentConfig, transcripts: list[list[dict[str, Any]]], out: Path) -> Any:
    from cadenza.rl.chat import CHAT_TEMPLATE, train_tokenizer

    texts = [_plain_text(m) for msgs in transcripts for m in msgs]
    texts += [f"Error: tool '{n}' not found." for p in PROFILES.values() for n in p.values()]
    texts += ["system\n", "user\n", "assistant\n"] * 50
    tok = train_tokenizer(texts, vocab_size=exp.vocab_size, extra_special_tokens=CALL_PIECES)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(str(out))
    return tok


def _plain_text(msg: dict[str, Any]) -> str:
    """A message in the chat format's surface form (enough for BPE merges; special tokens are added anyway)."""
    if msg.get("tool_calls"):
        fn = msg["tool_calls"][0]["function"]
        return f'<tool_call>\n{{"name": "{fn["name"]}", "arguments": {fn["arguments"]}}}\n</tool_call>'
    if msg["role"] == "tool":
        return f"<tool_response>\n{msg['content']}\n</tool_response>"
    return f"{msg['role']}\n{msg['content']}"


def sft_model(
    exp: ExperimentConfig, seed: int, tokenizer: Any, data: list[Any], out: Path, log: Callable[[str], None]
) -> Path:
    """Random init + SFT for one seed; saved as an HF directory (weights + tokenizer)."""
    from cadenza.rl.policy import HFPolicy, tiny_qwen3_config
    from cadenza.rl.sft import SFTConfig, supervised_finetune

    cfg = tiny_qwen3_config(len(tokenizer), hidden_size=exp.hidden_size, num_hidden_layers=exp.num_layers)
    policy = HFPolicy.from_config(cfg, seed=seed)
    losses = supervised_finetune(
        policy,
        tokenizer,
        data,
        SFTConfig(steps=exp.sft_steps, batch_size=exp.sft_batch, lr=exp.sft_lr, seed=seed),
    )
    log(f"seed {seed}: SFT loss {losses[0]:.3f} -> {sum(losses[-20:]) / len(losses[-20:]):.3f}")
    policy.model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


def measure_gap(model_dir: Path, n_tasks: int, seed: int) -> dict[str, float]:
    """P(first call uses a tool of the profile) with the tool-list hint in context vs without."""
    import torch
    from transformers import AutoTokenizer

    from cadenza.rl.chat import parse_tool_calls, render
    from cadenza.rl.policy import HFPolicy, SamplingParams

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    policy = HFPolicy.from_pretrained(model_dir)
    rng = random.Random(10_000 + seed)
    cfg = ToolworldConfig()
    envs = [ToolworldEnv(sample_task(rng, cfg, i), cfg) for i in range(n_tasks)]
    result = {}
    for key, hinted in (("valid_with_hint", True), ("valid_without_hint", False)):
        prompts = []
        for env in envs:
            msgs = env.reset()
            if hinted:
                msgs.append({"role": "user", "content": tool_list_hint(env)})
            prompts.append(
                tok.encode(render(tok, msgs, add_generation_prompt=True), add_special_tokens=False)
            )
        gen = torch.Generator().manual_seed(seed)
        params = SamplingParams(max_new_tokens=40, temperature=1.0, stop_token_ids=(tok.eos_token_id,))
        samples = policy.sample(prompts, params, generator=gen)
        valid = 0
        for env, s in zip(envs, samples, strict=True):
            calls = parse_tool_calls(tok.decode(s.token_ids))
            names = {t["function"]["name"] for t in env.tools()}
            valid += bool(calls) and calls[0].name in names
        result[key] = valid / len(envs)
    return result


def run_experiment(
    out: str | Path, exp: ExperimentConfig | None = None, *, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Run everything and write ``results.json``, ``summary.md``, ``curves.png`` into ``out``."""
    import torch

    from cadenza.metrics import read_metrics
    from cadenza.rl.sft import encode_messages
    from cadenza.rl.trainer import Trainer

    exp = exp or ExperimentConfig()
    if exp.threads:
        torch.set_num_threads(exp.threads)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise CadenzaError(f"--out {str(out)!r} is a file; pass a directory")
    out.mkdir(parents=True, exist_ok=True)
    t0, c0 = time.time(), time.process_time()
    transcripts = corpus(exp.corpus_seed, exp.corpus_size)
    tokenizer = build_tokenizer(exp, transcripts, out / "tokenizer")
    data = [encode_messages(tokenizer, m) for m in transcripts]
    log(
        f"corpus: {len(data)} transcripts, {sum(len(d) for d in data) / len(data):.0f} tokens each, vocab {len(tokenizer)}"
    )
    gaps, runs = {}, {arm: [] for arm in report.ARMS}
    for seed in exp.seeds:
        model_dir = sft_model(exp, seed, tokenizer, data, out / f"sft-seed{seed}", log)
        gaps[seed] = measure_gap(model_dir, exp.gap_tasks, seed)
        log(
            f"seed {seed}: pre-RL P(valid | hint) = {gaps[seed]['valid_with_hint']:.3f}, P(valid | no hint) = {gaps[seed]['valid_without_hint']:.3f}"
        )
        for arm in report.ARMS:
            run_dir = out / "runs" / f"{arm}-seed{seed}"
            shutil.rmtree(
                run_dir, ignore_errors=True
            )  # a stale run from another SFT model must not be resumed
            cfg = train_config(exp, arm, seed, model_dir, run_dir)
            Trainer(cfg).train()
            summary = report.summarise_run(read_metrics(run_dir / "metrics.jsonl"), seed, window=exp.window)
            runs[arm].append(summary)
            log(
                f"seed {seed} {arm}: episodes_to_95={summary['episodes_to_95']} final_success={summary['final_success']:.3f} "
                f"final_invalid={summary['final_invalid_rate']:.3f} ({time.time() - t0:.0f}s)"
            )
    results = {
        "pre_rl": {
            "valid_with_hint": sum(g["valid_with_hint"] for g in gaps.values()) / len(gaps),
            "valid_without_hint": sum(g["valid_without_hint"] for g in gaps.values()) / len(gaps),
        },
        "arms": runs,
        "seeds": list(exp.seeds),
        "pre_rl_per_seed": {str(k): v for k, v in gaps.items()},
        "config": dataclasses.asdict(exp),
        "wall_s": round(time.time() - t0, 1),
        "cpu_s": round(time.process_time() - c0, 1),
    }
    atomic_write_json(out / "results.json", results)
    report.plot_curves(results, out / "curves.png")
    atomic_write_text(out / "summary.md", report.summary_markdown(results))
    return results
