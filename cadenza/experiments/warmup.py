"""A tiny Qwen3 that speaks toolworld's call format: the SFT warm-up behind the RL tests and benchmarks.

A random-init model makes no valid tool calls, so RL on it has nothing to work with; a few seconds of
SFT on generated toolworld transcripts (:func:`cadenza.experiments.corpus.corpus`) give multi-turn
episodes whose hints drive real self-distillation updates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def warm_up_toolworld_model(out: str | Path, *, sft_steps: int = 60, **arch: Any) -> list[float]:
    """Train a tokenizer, SFT ``tiny_qwen3_config(**arch)`` for ``sft_steps`` and save both to ``out``.

    Deterministic (fixed corpus seed and init seed); returns the SFT losses so callers can check it learnt.
    """
    from cadenza.experiments.corpus import corpus
    from cadenza.experiments.tool_hints import CALL_PIECES, _plain_text
    from cadenza.rl.engines.policy import HFPolicy, tiny_qwen3_config
    from cadenza.rl.learn.sft import SFTConfig, encode_messages, supervised_finetune
    from cadenza.rl.text.chat import CHAT_TEMPLATE, train_tokenizer

    transcripts = corpus(seed=7, n=300)
    tok = train_tokenizer(
        [_plain_text(m) for t in transcripts for m in t] + ["assistant\n"] * 20,
        vocab_size=400,
        extra_special_tokens=CALL_PIECES,
    )
    tok.chat_template = CHAT_TEMPLATE
    policy = HFPolicy.from_config(tiny_qwen3_config(len(tok), **arch), seed=0)
    data = [encode_messages(tok, m) for m in transcripts]
    config = SFTConfig(steps=sft_steps, batch_size=16, lr=1e-2, warmup=5)
    losses = supervised_finetune(policy, tok, data, config)
    policy.model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return losses
