"""Policy backends: sampling with exact behaviour log-probs, and hidden states for training.

:class:`Policy` is the protocol rollouts need (token ids in, sampled ids + log-probs out), so a served
engine can plug in later. :class:`HFPolicy` wraps any HF transformers causal LM (local path or a config
for random init) and samples with its own KV-cached loop, which records the log-prob of each sampled
token under the distribution it was actually drawn from (temperature / top-k applied).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import torch

from cadenza.errors import CadenzaError


@dataclass(kw_only=True)
class SamplingParams:
    """``temperature == 0`` samples greedily and records log-probs at temperature 1."""

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_k: int = 0
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise CadenzaError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise CadenzaError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise CadenzaError(f"top_k must be >= 0 (0 = off), got {self.top_k}")


@dataclass(kw_only=True)
class Sample:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (a stop token was sampled, and is included) or "length"
    policy_version: int = 0  # version of the weights that sampled it (see cadenza.rl.engines.engine)


@dataclass(frozen=True)
class SampleRequest:
    """One batched sampling call: the arguments every policy and engine ``sample`` takes, in one place."""

    prompts: Sequence[Sequence[int]]  # token-id prompts (never re-rendered text), each at least one token
    params: SamplingParams
    generator: torch.Generator | None = None  # seeds the draw; engines derive per-request seeds from it
    # Served engines: one request seed per prompt, given (a router draws them before it splits the batch,
    # so a prompt's sample does not depend on which engine it went to); None = drawn from ``generator``.
    seeds: Sequence[int] | None = None
    # Per prompt: the most tokens it may take (its own remaining context, so a prompt near the window
    # never makes the engine refuse the batch); None = ``params.max_new_tokens`` for all. Served engines
    # send it per request; the in-process sampler runs to the batch's maximum (the rollout truncates).
    max_new_tokens: Sequence[int] | None = None

    def part(
        self,
        prompts: Sequence[Sequence[int]],
        generator: torch.Generator | None,
        seeds: Sequence[int] | None = None,
        max_new_tokens: Sequence[int] | None = None,
    ) -> SampleRequest:
        """The same parameters for a subset of the prompts (a router's share, one prompt of a batch)."""
        return replace(self, prompts=prompts, generator=generator, seeds=seeds, max_new_tokens=max_new_tokens)


class Policy(Protocol):
    def sample(self, request: SampleRequest) -> list[Sample]:
        """Continue each prompt (token ids); return the sampled ids and their behaviour log-probs."""


# The shape every tiny test/demo model shares (hidden 64, 2 layers, 4 heads of 16, untied embeddings).
_TINY: dict[str, Any] = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=8192,
    tie_word_embeddings=False,
)


def tiny_qwen3_config(vocab_size: int, **overrides: Any) -> Any:
    """A tiny dense Qwen3 config for tests and demos (hidden 64, 2 layers)."""
    from transformers import Qwen3Config

    return Qwen3Config(**{**_TINY, "vocab_size": vocab_size, "use_sliding_window": False, **overrides})


def tiny_qwen3_moe_config(vocab_size: int, **overrides: Any) -> Any:
    """A tiny Qwen3-MoE config (hidden 64, 2 layers, 8 experts, top-2) for tests and demos."""
    from transformers import Qwen3MoeConfig

    moe = dict(moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True)
    return Qwen3MoeConfig(**{**_TINY, "vocab_size": vocab_size, **moe, **overrides})


class HFPolicy:
    """A HF causal LM used both to sample (no grad) and to produce hidden states for the losses.

    Training code calls :meth:`hidden_states` and applies :attr:`lm_head` itself in chunks, so the
    ``[T, V]`` logits of a long trajectory are never materialised at once.
    """

    #: its samples depend on the batch they run in (padding, matmul blocking): the rollout gives it the
    #: same batches whatever the timing (:mod:`cadenza.rl.rollout.turn_batcher`)
    fixed_batches = True
    #: context parallelism (:class:`cadenza.parallel.context.ContextShare`): :meth:`hidden_states` covers
    #: only this rank's positions of the sequence; ``None``: whole sequences
    context: Any = None

    def __init__(self, model: torch.nn.Module, *, device: str | torch.device = "cpu") -> None:
        if model.get_output_embeddings() is None:
            raise CadenzaError(
                f"{type(model).__name__} has no output embeddings; use a causal LM (…ForCausalLM)"
            )
        self.model = model.to(device)
        self.device = torch.device(device)

    @classmethod
    def from_pretrained(cls, path: str | Path, *, dtype: str = "float32", device: str = "cpu") -> HFPolicy:
        from transformers import AutoModelForCausalLM

        path = Path(path)
        if not (path / "config.json").is_file():
            raise CadenzaError(
                f"model path {str(path)!r} does not exist or has no config.json; pass a local directory "
                "written by save_pretrained (nothing is downloaded)"
            )
        model = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=_dtype(dtype), attn_implementation="sdpa"
        )
        return cls(model, device=device)

    @classmethod
    def from_config(
        cls, config: Any, *, seed: int = 0, dtype: str = "float32", device: str = "cpu"
    ) -> HFPolicy:
        """Random init from a transformers config (deterministic under ``seed``)."""
        from transformers import AutoModelForCausalLM

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(config, dtype=_dtype(dtype), attn_implementation="sdpa")
        return cls(model, device=device)

    @property
    def lm_head(self) -> torch.nn.Module:
        return self.model.get_output_embeddings()

    @property
    def vocab_size(self) -> int:
        return int(self.lm_head.weight.shape[0])

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        position_ids: torch.Tensor | None = None,
        cache: Any = None,
        use_cache: bool = False,
    ) -> tuple[torch.Tensor, Any]:
        """Final hidden states ``[B, T, D]`` (before the LM head) and the KV cache when ``use_cache``."""
        out = self.decoder()(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=use_cache,
        )
        return out.last_hidden_state, (out.cache if use_cache else None)

    def decoder(self) -> Any:
        """The callable that computes the decoder's output (a sharded policy enters through its root)."""
        return self.model.get_decoder()

    @torch.no_grad()
    def sample(self, request: SampleRequest) -> list[Sample]:
        from transformers import DynamicCache

        prompts, params, generator = request.prompts, request.params, request.generator
        # per-prompt seeds: each row draws from its own generator, so its sample does not depend on the
        # other rows of the batch (the rollout's turns are batched however the episodes interleave)
        rows = None
        if request.seeds is not None:
            rows = [torch.Generator(device=self.device).manual_seed(int(s)) for s in request.seeds]

        if not prompts or any(len(p) == 0 for p in prompts):
            raise CadenzaError("every prompt must have at least one token")
        was_training = self.model.training
        self.model.eval()
        try:
            B, L = len(prompts), max(len(p) for p in prompts)
            ids = torch.zeros((B, L), dtype=torch.long, device=self.device)
            attn = torch.zeros((B, L), dtype=torch.long, device=self.device)
            for b, p in enumerate(prompts):  # left padding: every row's next token is at column L
                ids[b, L - len(p) :] = torch.tensor(list(p), dtype=torch.long)
                attn[b, L - len(p) :] = 1
            pos = (attn.cumsum(-1) - 1).clamp(min=0)
            cache = DynamicCache()
            stop = torch.tensor(sorted(set(params.stop_token_ids)), dtype=torch.long, device=self.device)
            out_ids: list[list[int]] = [[] for _ in range(B)]
            out_lp: list[list[float]] = [[] for _ in range(B)]
            done = [False] * B
            for _ in range(params.max_new_tokens):
                hidden, cache = self.hidden_states(ids, attn, position_ids=pos, cache=cache, use_cache=True)
                logits = self.lm_head(hidden[:, -1]).float()
                token, logprob = _draw(logits, params, generator, rows)
                for b in range(B):
                    if done[b]:
                        continue
                    out_ids[b].append(int(token[b]))
                    out_lp[b].append(float(logprob[b]))
                    if stop.numel() and bool((stop == token[b]).any()):
                        done[b] = True
                if all(done):
                    break
                ids = token[:, None]
                attn = torch.cat([attn, torch.ones((B, 1), dtype=attn.dtype, device=self.device)], dim=1)
                pos = pos[:, -1:] + 1
            return [
                Sample(
                    token_ids=out_ids[b], logprobs=out_lp[b], finish_reason="stop" if done[b] else "length"
                )
                for b in range(B)
            ]
        finally:
            self.model.train(was_training)


def _draw(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    rows: list[torch.Generator] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row (from ``rows[b]`` when given, else all from ``generator``); return it
    and its log-prob under the sampling distribution."""
    if params.temperature == 0:
        token = logits.argmax(-1)
        return token, torch.log_softmax(logits, -1).gather(-1, token[:, None])[:, 0]
    scaled = logits / params.temperature
    if params.top_k and params.top_k < scaled.shape[-1]:
        kth = scaled.topk(params.top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    logp = torch.log_softmax(scaled, -1)
    probs = logp.exp()
    if rows is not None:
        token = torch.cat([torch.multinomial(probs[b], 1, generator=g) for b, g in enumerate(rows)])
    else:
        token = torch.multinomial(probs, 1, generator=generator)[:, 0]
    return token, logp.gather(-1, token[:, None])[:, 0]


def _dtype(name: str) -> torch.dtype:
    table = {
        "float32": torch.float32,
        "bfloat16": torch.bfloat16,
        "float16": torch.float16,
        "float64": torch.float64,
    }
    if name not in table:
        raise CadenzaError(f"unknown dtype {name!r}; use one of {', '.join(table)}")
    return table[name]
