"""The tool-hint experiment's pieces: its pre-registered config, the arms, the warm-up model, the pre-RL gap.

Pipeline (all on CPU, seeds fixed and listed in the outputs; protocol in docs/experiments.md):
1. an SFT corpus of toolworld transcripts (:mod:`cadenza.experiments.corpus`) and a tokenizer trained on
   it; the corpus's placebo reminders use the tokenizer's token count, so they are the placebo arm's text;
2. per seed, a tiny random-init Qwen3 fine-tuned on the corpus; the pre-RL gap
   P(valid tool | tool list in context) vs P(valid tool | no list) is measured on held-out tasks;
3. the ``supervised`` control fixes the budget; every arm runs from the same start with equal budgets,
   the RL arms by the ordinary trainer (:class:`cadenza.rl.train.trainer.Trainer`), scored on a fixed held-out
   set every ``eval_every`` steps (:mod:`cadenza.experiments.arms`, :mod:`cadenza.experiments.study`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cadenza.experiments.corpus import tool_list_hint
from cadenza.experiments.toolworld import PROFILES, ToolworldConfig, ToolworldEnv, sample_task


@dataclass(kw_only=True)
class ExperimentConfig:
    """Pre-registered in docs/experiments.md; ``--quick`` only shrinks seeds, sizes and budgets."""

    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])
    arms: list[str] = field(default_factory=lambda: list(ARMS))
    corpus_size: int = 2000
    corpus_seed: int = 12345
    vocab_size: int = 512
    sft_steps: int = 400
    sft_batch: int = 16
    sft_lr: float = 3e-3
    gap_tasks: int = 256
    max_steps: int = 150  # cap of the supervised control's run (and of the budget)
    budget_steps: int = 0  # RL steps of every non-control arm; 0 = where `supervised` reaches 95%
    tasks_per_step: int = 4
    group_size: int = 8
    rl_lr: float = 5e-4
    lambda_sd: float = 1.0
    top_k: int = 8
    temperature: float = 1.0
    max_new_tokens: int = 32
    hidden_size: int = 64
    num_layers: int = 2
    eval_every: int = 5  # held-out scoring (and the hint-following diagnostic) every K steps
    heldout_tasks: int = 64  # fixed held-out toolworld tasks, identical for all arms and seeds
    heldout_seed: int = 777
    target: float = 0.95  # held-out valid-call rate that counts as "reached"
    probe_items: int = 32
    ema_decay: float = 0.99
    refresh_every: int = 10
    window: int = 3  # training-batch curve: steps averaged by the old (batch) measure, kept for comparison
    threads: int = 1  # tiny models are overhead-bound; one thread avoids OpenMP contention on shared CPUs

    @classmethod
    def quick(cls) -> ExperimentConfig:
        """A smoke test of the whole pipeline: it says nothing about the arms."""
        return cls(
            seeds=[0],
            corpus_size=1000,
            sft_steps=300,
            gap_tasks=64,
            max_steps=6,
            eval_every=2,
            heldout_tasks=16,
            probe_items=8,
        )

    @property
    def episodes_per_step(self) -> int:
        return self.tasks_per_step * self.group_size

    # what the shared runner (arms.py, heldout.py) asks of an experiment config; properties and methods
    # are not dataclass fields, so settings.json (the run's pin) is unchanged by them
    @property
    def toolworld(self) -> ToolworldConfig:
        return ToolworldConfig()

    @property
    def response_prefix(self) -> str:
        return ""

    def train_config(self, arm: str, seed: int, model_dir: Path, out_dir: Path, steps: int) -> Any:
        return train_config(self, arm, seed, model_dir, out_dir, steps)


# arm -> what differs from plain GRPO (None = the experiment's value)
ARM_SETTINGS: dict[str, dict[str, Any]] = {
    "supervised": {"lambda_sd": 0.0, "top_k": 0, "placebo": False, "teacher": "frozen"},
    "grpo": {"lambda_sd": 0.0, "top_k": 0, "placebo": False, "teacher": "frozen"},
    "grpo_sd": {"lambda_sd": None, "top_k": 0, "placebo": False, "teacher": "frozen"},
    "grpo_sd_topk": {"lambda_sd": None, "top_k": None, "placebo": False, "teacher": "frozen"},
    "placebo": {"lambda_sd": None, "top_k": 0, "placebo": True, "teacher": "frozen"},
    "sd_live": {"lambda_sd": None, "top_k": 0, "placebo": False, "teacher": "live"},
    "sd_ema": {"lambda_sd": None, "top_k": 0, "placebo": False, "teacher": "ema"},
    "sd_snapshot": {"lambda_sd": None, "top_k": 0, "placebo": False, "teacher": "snapshot"},
}
ARMS = tuple(ARM_SETTINGS)


def train_config(
    exp: ExperimentConfig, arm: str, seed: int, model_dir: Path, out_dir: Path, steps: int
) -> Any:
    """The trainer config of one (arm, seed) run up to ``steps``: only loss weight, top-k, placebo and
    teacher differ."""
    from cadenza.feedback.generate import FeedbackConfig
    from cadenza.rl.config import (
        EnvConfig,
        LossConfig,
        ModelConfig,
        OptimConfig,
        ProbeConfig,
        RolloutConfig,
        RunConfig,
        TeacherConfig,
        TrainConfig,
    )

    s = ARM_SETTINGS[arm]
    lam = exp.lambda_sd if s["lambda_sd"] is None else s["lambda_sd"]
    top_k = exp.top_k if s["top_k"] is None else s["top_k"]
    return TrainConfig(
        run=RunConfig(
            out_dir=str(out_dir),
            steps=steps,
            seed=seed,
            checkpoint_every=exp.eval_every,
            keep_checkpoints=1,
            progress=False,
            threads=exp.threads,
            measure_kl=True,
        ),
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
        teacher=TeacherConfig(weights=s["teacher"], ema_decay=exp.ema_decay, refresh_every=exp.refresh_every),
        probe=ProbeConfig(every=exp.eval_every, items=exp.probe_items, seed=exp.heldout_seed),
        optim=OptimConfig(lr=exp.rl_lr),
        feedback=FeedbackConfig(kinds=["tool_not_found"] if lam > 0 else [], placebo=s["placebo"]),
    )


# Fixed pieces of the tool-call JSON as single tokens: a byte-level BPE trained on this tiny corpus
# cannot merge across its pre-tokenizer's punctuation splits, and half of every turn would be glue.
CALL_PIECES = ('{"name": "', '", "arguments": ', '{"path": "', '"}}')


def build_tokenizer(exp: ExperimentConfig, transcripts: list[list[dict[str, Any]]], out: Path) -> Any:
    from cadenza.rl.text.chat import CHAT_TEMPLATE, train_tokenizer

    texts = [_plain_text(m) for msgs in transcripts for m in msgs]
    texts += [f"Error: tool '{n}' not found." for p in PROFILES.values() for n in p.values()]
    texts += ["system\n", "user\n", "assistant\n"] * 50
    tok = train_tokenizer(texts, vocab_size=exp.vocab_size, extra_special_tokens=CALL_PIECES)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(str(out))
    return tok


def _plain_text(msg: dict[str, Any]) -> str:
    """A message in the chat format's surface form (enough for BPE merges; special tokens are added
    anyway)."""
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
    from cadenza.rl.engines.policy import HFPolicy, tiny_qwen3_config
    from cadenza.rl.learn.sft import SFTConfig, supervised_finetune

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


def measure_gap(
    model_dir: Path,
    n_tasks: int,
    seed: int,
    *,
    config: ToolworldConfig | None = None,
    prefix: str = "",
    max_new_tokens: int = 40,
    details: bool = False,
    device: str = "cpu",
    batch: int = 0,
) -> dict[str, Any]:
    """P(first call uses a tool of the profile) with the tool-list hint in context vs without.

    ``prefix``: text the assistant turn starts with (``rollout.response_prefix``), prepended before parsing.
    ``details``: also the most frequent invalid names of each condition (``invalid_names_*``);
    ``batch``: prompts per sampling call (0 = all at once, as the tool-hint experiment measures it)."""
    from collections import Counter

    import torch
    from transformers import AutoTokenizer

    from cadenza.rl.engines.policy import HFPolicy, SampleRequest, SamplingParams
    from cadenza.rl.text.chat import parse_tool_calls, render

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    policy = HFPolicy.from_pretrained(model_dir, device=device)
    rng = random.Random(10_000 + seed)
    cfg = config or ToolworldConfig()
    envs = [ToolworldEnv(sample_task(rng, cfg, i), cfg) for i in range(n_tasks)]
    result: dict[str, Any] = {}
    for key, hinted in (("valid_with_hint", True), ("valid_without_hint", False)):
        prompts = []
        for env in envs:
            msgs = env.reset()
            if hinted:
                msgs.append({"role": "user", "content": tool_list_hint(env)})
            text = render(tok, msgs, add_generation_prompt=True) + prefix
            prompts.append(tok.encode(text, add_special_tokens=False))
        gen = torch.Generator().manual_seed(seed)
        params = SamplingParams(
            max_new_tokens=max_new_tokens, temperature=1.0, stop_token_ids=(tok.eos_token_id,)
        )
        step = batch or len(prompts)  # batches bound the prefill's memory (logits over a real vocabulary)
        samples = [
            x
            for i in range(0, len(prompts), step)
            for x in policy.sample(SampleRequest(prompts[i : i + step], params, gen))
        ]
        valid, wrong = 0, Counter()
        for env, s in zip(envs, samples, strict=True):
            calls = parse_tool_calls(prefix + tok.decode(s.token_ids))
            names = {t["function"]["name"] for t in env.tools()}
            ok = bool(calls) and calls[0].name in names
            valid += ok
            if not ok:
                wrong[calls[0].name if calls else "(no call)"] += 1
        result[key] = valid / len(envs)
        if details:
            result["invalid_names_" + key.removeprefix("valid_")] = dict(wrong.most_common(8))
    return result
