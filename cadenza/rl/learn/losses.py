"""Losses for targeted RL: per-turn self-distillation (full-vocabulary, top-k, sampled-token) and GRPO.

Pure functions on tensors. Conventions:

* ``student_logits`` / ``teacher_logits`` are ``[B, T, V]`` and aligned to the *same target tokens*
  (row ``t`` of both holds the distribution over target token ``t``); ``mask`` is ``[B, T]``.
* Divergences are computed in (at least) float32 after dividing logits by ``temperature``.
* The teacher never receives gradient: its logits are detached here, whatever the caller passed.
* ``jsd`` follows the generalised JSD of GKD (Agarwal et al., 2024) as implemented in TRL:
  ``M = beta * teacher + (1 - beta) * student`` and
  ``JSD_beta = beta * KL(teacher || M) + (1 - beta) * KL(student || M)``;
  ``beta == 0`` is defined as forward KL(teacher || student) and ``beta == 1`` as reverse
  KL(student || teacher) (the interior expression itself vanishes at both ends, so the endpoints are
  special-cased exactly like TRL's ``generalized_jsd_loss``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cadenza.errors import CadenzaError

DIVERGENCES = ("reverse_kl", "forward_kl", "jsd")
AGGREGATIONS = ("token_mean", "sequence_mean")


@dataclass(frozen=True, kw_only=True)
class DivergenceSpec:
    """Which divergence self-distillation minimises, and how both distributions are shaped first."""

    divergence: str = "reverse_kl"  # reverse_kl | forward_kl | jsd
    beta: float = 0.5  # jsd weight of the teacher in the mixture
    top_k: int | None = None  # reduce both to the teacher's top-k tokens plus one tail bucket
    temperature: float = 1.0  # logits are divided by it before the softmax

    def __post_init__(self) -> None:
        if self.divergence not in DIVERGENCES:
            raise CadenzaError(f"unknown divergence {self.divergence!r}; use one of {', '.join(DIVERGENCES)}")
        if not 0.0 <= float(self.beta) <= 1.0:
            raise CadenzaError(f"jsd beta must be in [0, 1], got {self.beta}")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 1):
            raise CadenzaError(f"top_k must be a positive integer or None, got {self.top_k!r}")
        if not self.temperature > 0:
            raise CadenzaError(f"temperature must be > 0, got {self.temperature}")


def _kl(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """KL(p || q) over the last dim from log-probs; 0 * log 0 terms count as 0."""
    p = logp.exp()
    diff = torch.where(p > 0, logp - logq, torch.zeros_like(p))
    return (p * diff).sum(-1)


def _topk_with_tail(logp: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Log-probs of the ``idx`` tokens plus one tail bucket holding all remaining mass: ``[..., k + 1]``."""
    head = logp.gather(-1, idx)
    tail = logp.scatter(-1, idx, float("-inf")).logsumexp(-1, keepdim=True)
    return torch.cat([head, tail], dim=-1)


def token_divergence(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, spec: DivergenceSpec = DivergenceSpec()
) -> torch.Tensor:
    """Per-position divergence between student and teacher distributions: shape ``logits.shape[:-1]``."""
    divergence, beta, top_k, temperature = spec.divergence, spec.beta, spec.top_k, spec.temperature
    if student_logits.shape != teacher_logits.shape:
        raise CadenzaError(
            f"student logits {tuple(student_logits.shape)} and teacher logits {tuple(teacher_logits.shape)} "
            "must have the same shape (aligned to the same target tokens)"
        )
    dtype = torch.promote_types(student_logits.dtype, torch.float32)
    s = F.log_softmax(student_logits.to(dtype) / temperature, dim=-1)
    t = F.log_softmax(teacher_logits.detach().to(dtype) / temperature, dim=-1)
    if top_k is not None and top_k < s.shape[-1]:
        idx = t.topk(top_k, dim=-1).indices
        s, t = _topk_with_tail(s, idx), _topk_with_tail(t, idx)
    if divergence == "reverse_kl" or (divergence == "jsd" and beta == 1.0):
        return _kl(s, t)
    if divergence == "forward_kl" or (divergence == "jsd" and beta == 0.0):
        return _kl(t, s)
    log_m = torch.logsumexp(torch.stack([s + math.log1p(-beta), t + math.log(beta)]), dim=0)
    return beta * _kl(t, log_m) + (1.0 - beta) * _kl(s, log_m)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over positions where ``mask`` is nonzero (0 when the mask is empty)."""
    if values.shape != mask.shape:
        raise CadenzaError(f"mask shape {tuple(mask.shape)} must match {tuple(values.shape)}")
    m = mask.to(values.dtype)
    return (values * m).sum() / m.sum().clamp(min=1.0)


def self_distillation_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    mask: torch.Tensor,
    spec: DivergenceSpec = DivergenceSpec(),
) -> torch.Tensor:
    """Mean over masked tokens of the per-token divergence between student and (detached) teacher.

    ``reverse_kl`` = KL(student || teacher) (mode-seeking, the on-policy distillation default),
    ``forward_kl`` = KL(teacher || student), ``jsd`` = generalised JSD with weight ``beta``.
    With ``top_k=k`` both distributions are reduced to the teacher's top-k tokens plus one tail
    bucket holding the remaining probability mass, so the divergence stays a proper divergence.
    """
    per_token = token_divergence(student_logits, teacher_logits, spec)
    return masked_mean(per_token, mask)


def sampled_token_sd_loss(
    student_logprobs: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    mask: torch.Tensor,
    behaviour_logprobs: torch.Tensor | None = None,
    is_cap: float = 0.0,
) -> torch.Tensor:
    """Single-sample estimator of reverse KL(student || teacher) on the tokens the sampler drew.

    For a token ``y ~ student``, ``log p_s(y) - log p_t(y)`` is an unbiased estimate of the reverse KL.
    The returned value equals the masked mean of that estimate; its gradient is the score-function
    (policy-gradient) term ``(log p_s(y) - log p_t(y)) * grad log p_s(y)`` — the on-policy gradient of
    the reverse KL, i.e. REINFORCE with per-token reward ``log p_t(y) - log p_s(y)`` (OPSD style).
    Needs only the log-probs of the sampled tokens, not the teacher's full distribution.

    Off-policy (the tokens were drawn by ``mu``: a stale or other-kernel engine, another temperature)
    pass ``behaviour_logprobs`` = ``log mu(y)``: each token is weighted by ``p_s(y) / mu(y)`` (detached,
    capped at ``is_cap`` when > 0), which makes value and gradient unbiased under ``mu`` again.
    """
    per_token = sampled_token_surrogate(student_logprobs, teacher_logprobs, behaviour_logprobs, is_cap)
    return masked_mean(per_token, mask)


def sampled_token_surrogate(
    student_logprobs: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor | None = None,
    is_cap: float = 0.0,
) -> torch.Tensor:
    """Per-token surrogate of :func:`sampled_token_sd_loss`: value ``w (log p_s - log p_t)``, gradient
    ``w (log p_s - log p_t) grad log p_s``, ``w = min(p_s / mu, is_cap)`` (1 without behaviour log-probs)."""
    if student_logprobs.shape != teacher_logprobs.shape:
        raise CadenzaError("student and teacher log-probs must have the same shape")
    gap = (student_logprobs - teacher_logprobs.detach()).detach()
    surrogate = gap + gap * (student_logprobs - student_logprobs.detach())
    if behaviour_logprobs is None:
        return surrogate
    if behaviour_logprobs.shape != student_logprobs.shape:
        raise CadenzaError("behaviour log-probs must have the shape of the student's")
    with torch.no_grad():
        weight = torch.exp(student_logprobs.detach() - behaviour_logprobs.detach().to(student_logprobs.dtype))
        if is_cap > 0:
            weight = weight.clamp(max=is_cap)
    return weight * surrogate


def group_advantages(
    rewards: torch.Tensor | list[float],
    group_ids: list[str] | list[int] | torch.Tensor,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """GRPO advantages: reward minus its group mean, divided by the group std when ``normalize_std``.

    The std is the unbiased sample std (as in TRL's GRPO); a group of one sample, or one whose rewards
    are all equal, gets advantage 0. ``normalize_std=False`` is the Dr. GRPO variant.
    """
    r = torch.as_tensor(rewards, dtype=torch.float32)
    ids = group_ids.tolist() if isinstance(group_ids, torch.Tensor) else list(group_ids)
    if r.ndim != 1 or len(ids) != r.shape[0]:
        raise CadenzaError(
            f"rewards ({tuple(r.shape)}) and group_ids ({len(ids)}) must be 1-D and the same length"
        )
    adv = torch.zeros_like(r)
    for gid in dict.fromkeys(ids):
        sel = torch.tensor([i == gid for i in ids])
        g = r[sel]
        centered = g - g.mean()
        if normalize_std:
            std = g.std() if g.numel() > 1 else torch.zeros(())
            centered = centered / (std + eps)
        adv[sel] = centered
    return adv


def grpo_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    aggregation: str = "token_mean",
    is_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Token-level clipped surrogate (PPO/GRPO) against the behaviour log-probs, plus optional k3 KL.

    ``logprobs``/``behaviour_logprobs``/``mask`` are ``[B, T]``; ``advantages`` is ``[B]`` (one per
    sequence) or ``[B, T]``. Per token: ``-min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)`` with
    ``r = exp(logprobs - behaviour_logprobs)``; with ``ref_logprobs`` and ``kl_coef > 0`` the k3
    estimator ``exp(ref - logp) - (ref - logp) - 1`` of KL(policy || ref) is added per token.
    ``aggregation``: ``token_mean`` (all masked tokens of the batch weigh equally, DAPO) or
    ``sequence_mean`` (mean per sequence, then over sequences, original GRPO).
    ``is_weights`` (``[B, T]``, detached) multiplies each token's surrogate: the decoupled off-policy
    form passes the trainer's own log-probs as ``behaviour_logprobs`` (the proximal policy) and
    :func:`truncated_is_weights` of those against the engine's log-probs here.
    """
    if aggregation not in AGGREGATIONS:
        raise CadenzaError(f"unknown aggregation {aggregation!r}; use one of {', '.join(AGGREGATIONS)}")
    if clip_eps_low < 0 or clip_eps_high < 0:
        raise CadenzaError("clip_eps_low and clip_eps_high must be >= 0")
    if logprobs.shape != behaviour_logprobs.shape or logprobs.shape != mask.shape:
        raise CadenzaError("logprobs, behaviour_logprobs and mask must all be [B, T]")
    if advantages.ndim == 1:
        advantages = advantages[:, None]
    advantages = advantages.to(device=logprobs.device, dtype=logprobs.dtype).detach()
    ratio = torch.exp(logprobs - behaviour_logprobs.detach())
    clipped = ratio.clamp(1.0 - clip_eps_low, 1.0 + clip_eps_high)
    per_token = -torch.minimum(ratio * advantages, clipped * advantages)
    if is_weights is not None:
        per_token = per_token * is_weights.detach().to(per_token.dtype)
    if ref_logprobs is not None and kl_coef != 0.0:
        delta = ref_logprobs.detach() - logprobs
        per_token = per_token + kl_coef * (torch.exp(delta) - delta - 1.0)
    m = mask.to(per_token.dtype)
    if aggregation == "token_mean":
        return (per_token * m).sum() / m.sum().clamp(min=1.0)
    per_seq = (per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)
    has_tokens = (m.sum(-1) > 0).to(per_seq.dtype)
    return (per_seq * has_tokens).sum() / has_tokens.sum().clamp(min=1.0)


def clip_fraction(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
) -> torch.Tensor:
    """Fraction of masked tokens the PPO clip actually acts on (a logging metric).

    A token is clipped when :func:`grpo_loss`'s ``min`` picks the clipped branch with the ratio outside
    the range, so the token passes no gradient: ``A > 0`` and ``r > 1 + eps_high``, or ``A < 0`` and
    ``r < 1 - eps_low``. ``behaviour_logprobs`` must be the ones the surrogate's ratio uses (the proximal
    policy's in the decoupled off-policy form); engine/trainer mismatch is ``mismatch_kl``, not this.
    """
    with torch.no_grad():
        if advantages.ndim == 1:
            advantages = advantages[:, None]
        adv = advantages.to(device=logprobs.device, dtype=logprobs.dtype).expand_as(logprobs)
        ratio = torch.exp(logprobs - behaviour_logprobs)
        hit = ((adv > 0) & (ratio > 1.0 + clip_eps_high)) | ((adv < 0) & (ratio < 1.0 - clip_eps_low))
        return masked_mean(hit.to(torch.float32), mask.to(torch.float32))


def truncated_is_weights(
    proximal_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncated importance weights ``min(pi_prox / mu, cap)`` per token, and where the cap bit (bool).

    ``mu`` is the engine's behaviour log-prob (possibly stale weights, other kernels), ``pi_prox`` the
    trainer's log-prob under the weights being updated. Truncation (Ionides 2008; TIS, Yao et al. 2025)
    bounds the variance an off-policy token can add; no gradient flows through the weights.
    """
    if cap < 1:
        raise CadenzaError(f"the importance-sampling cap must be >= 1, got {cap}")
    if proximal_logprobs.shape != behaviour_logprobs.shape:
        raise CadenzaError("proximal and behaviour log-probs must have the same shape")
    with torch.no_grad():
        ratio = torch.exp(proximal_logprobs.detach() - behaviour_logprobs.detach())
        return ratio.clamp(max=cap), ratio > cap
