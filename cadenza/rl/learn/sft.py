"""Supervised fine-tuning on chat transcripts: the warm start before RL (and the tool-hint experiment's
pre-RL policy). Transcripts are encoded segment by segment exactly as rollouts see them (context
segments rendered by the chat template, assistant text tokenised on its own and ending with the
end-of-turn token), so SFT and RL train the same token layout.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from cadenza.errors import CadenzaError
from cadenza.rl.text.chat import render
from cadenza.rl.text.tokens import TokenTrajectory, TokenTrajectoryBuilder, collate


def encode_messages(
    tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
) -> TokenTrajectory:
    """One transcript -> a :class:`TokenTrajectory` whose model tokens are the assistant messages."""
    eos = tokenizer.eos_token
    builder = TokenTrajectoryBuilder()
    emitted = ""  # rendered text already turned into tokens
    first = True

    def tok(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False) if text else []

    for i, msg in enumerate(messages):
        if msg.get("role") != "assistant":
            continue
        before = render(tokenizer, messages[:i], tools, add_generation_prompt=True)
        after = render(tokenizer, messages[: i + 1], tools)
        if not before.startswith(emitted) or not after.startswith(before):
            raise CadenzaError(
                "the chat template is not prefix-stable; SFT encoding needs a template like "
                "cadenza.rl.text.chat.CHAT_TEMPLATE"
            )
        builder.add("prompt" if first else "observation", tok(before[len(emitted) :]), message_index=i - 1)
        model_text = after[len(before) :]
        cut = model_text.rfind(eos)
        if cut < 0:
            raise CadenzaError(
                f"assistant message {i} does not end with the eos token {eos!r} under this template"
            )
        model_text = model_text[: cut + len(eos)]
        ids = tok(model_text)
        builder.add("assistant", ids, message_index=i, logprobs=[0.0] * len(ids))
        emitted = before + model_text
        first = False
    if not builder.turn_spans:
        raise CadenzaError("transcript has no assistant message to learn from")
    return builder.build(messages=list(messages))


def policy_token_logprobs(
    policy: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of each token given its prefix (position t scores token t; position 0 gets 0) and entropy."""
    hidden, _ = policy.hidden_states(input_ids, attention_mask)
    logits = policy.lm_head(hidden[:, :-1]).float()
    logp = torch.log_softmax(logits, -1)
    tok_lp = logp.gather(-1, input_ids[:, 1:, None])[..., 0]
    ent = -(logp.exp() * logp).sum(-1)
    pad = torch.zeros_like(tok_lp[:, :1])
    return torch.cat([pad, tok_lp], 1), torch.cat([pad, ent.detach()], 1)


@dataclass(kw_only=True)
class SFTConfig:
    """Supervised fine-tuning on transcripts: the warm-up that gives RL a policy that can call tools."""

    steps: int = 300  # optimizer steps (the data is reshuffled into length-bucketed batches as it runs out)
    batch_size: int = 32  # transcripts per step
    lr: float = 3e-3  # AdamW peak learning rate, reached after `warmup` steps
    weight_decay: float = 0.0  # AdamW weight decay
    warmup: int = 20  # steps of linear learning-rate warm-up
    seed: int = 0  # seed of the batch order


def supervised_finetune(
    policy: Any,
    tokenizer: Any,
    data: list[TokenTrajectory],
    config: SFTConfig,
    *,
    on_step: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Cross-entropy on model tokens (token mean over the batch), AdamW with linear warmup; returns losses."""
    if not data:
        raise CadenzaError("SFT needs at least one transcript")
    rng = random.Random(config.seed)
    model = policy.model
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, config.warmup)))
    batches: list[list[int]] = []
    losses = []
    for step in range(config.steps):
        if not batches:
            batches = _length_bucketed_batches(data, config.batch_size, rng)
        batch = [data[i] for i in batches.pop()]
        tb = collate(batch, tokenizer.pad_token_id)
        lp, _ = policy_token_logprobs(policy, tb.input_ids, tb.attention_mask)
        loss = -(lp * tb.loss_mask).sum() / tb.loss_mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if on_step:
            on_step(step, float(loss))
    return losses


def _length_bucketed_batches(
    data: list[TokenTrajectory], batch_size: int, rng: random.Random
) -> list[list[int]]:
    """One epoch of batches; similar lengths share a batch (less padding), batch order is random."""
    order = list(range(len(data)))
    rng.shuffle(order)
    pool = batch_size * 8
    batches = []
    for lo in range(0, len(order), pool):
        chunk = sorted(order[lo : lo + pool], key=lambda i: len(data[i]))
        batches += [chunk[j : j + batch_size] for j in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    return batches
