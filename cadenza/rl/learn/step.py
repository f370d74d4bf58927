"""One training step's losses: ``L = L_grpo + lambda_sd * L_sd`` from a single student forward pass.

The student forward over the padded batch yields hidden states (and, when hints exist and the
teacher is live, a KV cache); GRPO log-probs are computed from them in chunks on model tokens only,
and the hinted teachers reuse the cache. Metrics include entropy and KL-to-behaviour on *un-hinted*
model tokens, the signals to watch for SD destabilising the policy (SDAR).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from cadenza.errors import CadenzaError
from cadenza.rl.config import LossConfig
from cadenza.rl.engines.policy import HFPolicy
from cadenza.rl.learn.logprobs import sequence_logprobs
from cadenza.rl.learn.losses import clip_fraction, grpo_loss, masked_mean, truncated_is_weights
from cadenza.rl.learn.teacher import HintedTurn, SDResult, Teacher
from cadenza.rl.text.tokens import TokenBatch


@dataclass(kw_only=True)
class StepLosses:
    loss: torch.Tensor
    grpo: torch.Tensor
    sd: SDResult
    entropy_unhinted: float  # mean entropy (nats) on model tokens of turns without hints
    kl_unhinted: float  # mean k3 estimate of KL(behaviour || current) on those tokens
    clip_fraction: float
    num_model_tokens: int
    mismatch_kl: float = 0.0  # mean k3 KL(engine || trainer) on all model tokens (staleness + kernel drift)
    is_truncated: float = 0.0  # fraction of model tokens whose importance weight hit is_cap


def hinted_mask(batch: TokenBatch, items: Sequence[HintedTurn]) -> torch.Tensor:
    """``[B, T]`` 1 on the tokens of hinted target turns."""
    mask = torch.zeros_like(batch.loss_mask)
    for it in items:
        mask[it.row, it.turn_start : it.turn_end] = 1
    return mask


def rl_losses(
    policy: HFPolicy,
    batch: TokenBatch,
    advantages: torch.Tensor,
    *,
    items: Sequence[HintedTurn] = (),
    teacher: Teacher | None = None,
    loss: LossConfig | None = None,
    temperature: float = 1.0,
    chunk_size: int | None = 1024,
    off_policy: bool = False,
    ref_logprobs: torch.Tensor | None = None,
) -> StepLosses:
    """Forward the student once and return the combined loss (call ``.loss.backward()``) and metrics.

    ``loss`` is the run's ``[loss]``; ``temperature`` the sampling temperature (log-probs are computed
    under the same scaling); ``chunk_size`` tokens per logits chunk. ``off_policy``: the engine's
    weights can differ from the trainer's (asynchronous rollouts, another engine's kernels), so with
    ``loss.is_cap > 0`` ratios are taken against the trainer's own log-probs and each token weighted
    by ``min(pi_trainer / mu_engine, is_cap)`` (decoupled PPO); otherwise against the engine's.
    ``advantages`` is ``[B]`` (e.g. :func:`cadenza.rl.learn.losses.group_advantages` of ``batch.rewards``);
    ``ref_logprobs`` (``[B, T]``, aligned like the batch) enables the KL-to-reference term.
    """
    cfg = loss or LossConfig()
    if not temperature > 0:
        raise CadenzaError(f"temperature must be > 0, got {temperature}")
    if items and teacher is None:
        raise CadenzaError(
            "hinted turns were given but no teacher; build one with cadenza.rl.learn.teacher.Teacher"
        )
    use_sd = bool(items) and cfg.lambda_sd > 0
    want_cache = use_sd and teacher is not None and teacher.reuses_student_cache
    context = getattr(policy, "context", None)  # context parallelism: hidden states of this rank's share
    hidden, cache = policy.hidden_states(batch.input_ids, batch.attention_mask, use_cache=want_cache)
    logprobs, entropy = sequence_logprobs(
        hidden,
        policy.lm_head,
        batch.input_ids,
        batch.loss_mask,
        chunk_size=chunk_size,
        temperature=temperature,
        context=context,
    )
    behaviour, is_weights, truncated = batch.behaviour_logprobs, None, None
    if off_policy and cfg.is_cap > 0:  # the trainer's weights are the proximal policy; IS weights the rest
        is_weights, truncated = truncated_is_weights(logprobs, behaviour, cfg.is_cap)
        behaviour = logprobs.detach()
    grpo = grpo_loss(
        logprobs,
        behaviour,
        advantages,
        batch.loss_mask,
        cfg.clip_eps,
        cfg.clip_eps_high,
        ref_logprobs=ref_logprobs,
        kl_coef=cfg.kl_ref,
        aggregation=cfg.aggregation,
        is_weights=is_weights,
    )
    if use_sd:
        # the sampled SD estimator is importance-weighted when its tokens came from another distribution
        resampled = off_policy or cfg.sd_temperature != temperature
        mu = batch.behaviour_logprobs if resampled else None
        sd = teacher.loss(hidden, policy.lm_head, items, cache, behaviour_logprobs=mu, context=context)
        loss = grpo + cfg.lambda_sd * sd.loss
    else:
        sd = SDResult(loss=torch.zeros((), device=hidden.device), num_tokens=0)
        loss = grpo
    with torch.no_grad():
        unhinted = batch.loss_mask * (1 - hinted_mask(batch, items))
        log_ratio = logprobs - batch.behaviour_logprobs  # tokens were sampled from the behaviour policy
        k3 = torch.exp(log_ratio) - log_ratio - 1
        return StepLosses(
            loss=loss,
            grpo=grpo,
            sd=sd,
            entropy_unhinted=float(masked_mean(entropy, unhinted)),
            kl_unhinted=float(masked_mean(k3, unhinted)),
            # against the ratio the surrogate used: where the clip really acted
            clip_fraction=float(
                clip_fraction(
                    logprobs, behaviour, advantages, batch.loss_mask, cfg.clip_eps, cfg.clip_eps_high
                )
            ),
            num_model_tokens=int(batch.loss_mask.sum()),
            mismatch_kl=float(masked_mean(k3, batch.loss_mask)),
            is_truncated=float(masked_mean(truncated.float(), batch.loss_mask))
            if truncated is not None
            else 0.0,
        )
