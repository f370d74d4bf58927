"""Log-probs and divergences from hidden states, chunked so ``[T, V]`` float32 logits never exist whole.

Each chunk projects hidden states through the LM head, reduces to per-token numbers and, under
autograd, is wrapped in activation checkpointing so the backward pass recomputes one chunk's logits
at a time instead of keeping all of them. ``chunk_size=None`` is the plain (unchunked) path, kept for
tests and the memory benchmark.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from cadenza.errors import CadenzaError
from cadenza.rl.learn.losses import DivergenceSpec, token_divergence


def _map_chunks(
    fn: Callable[..., tuple[torch.Tensor, ...]], tensors: tuple[torch.Tensor, ...], chunk_size: int | None
) -> tuple[torch.Tensor, ...]:
    """Apply ``fn`` to row-chunks of ``tensors`` (all ``[N, ...]``) and concatenate the outputs."""
    n = tensors[0].shape[0]
    if chunk_size is None or n <= chunk_size:
        return fn(*tensors)
    if chunk_size < 1:
        raise CadenzaError(f"chunk_size must be >= 1 or None, got {chunk_size}")
    outs = []
    for start in range(0, n, chunk_size):
        part = tuple(t[start : start + chunk_size] for t in tensors)
        if torch.is_grad_enabled():
            outs.append(checkpoint(fn, *part, use_reentrant=False))
        else:
            outs.append(fn(*part))
    return tuple(torch.cat(o, dim=0) for o in zip(*outs, strict=True))


def token_logprobs(
    hidden: torch.Tensor,
    lm_head: torch.nn.Module,
    targets: torch.Tensor,
    *,
    chunk_size: int | None = 1024,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of ``targets`` ``[N]`` under the distributions at ``hidden`` ``[N, D]``, and the entropy (no
    grad)."""

    def chunk(hc: torch.Tensor, tc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = lm_head(hc)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature
        lse = logits.logsumexp(-1)
        lp = logits.gather(-1, tc[:, None])[:, 0] - lse
        ent = (lse - (logits.softmax(-1) * logits).sum(-1)).detach()
        return lp, ent

    return _map_chunks(chunk, (hidden, targets), chunk_size)


def sequence_logprobs(
    hidden: torch.Tensor,
    lm_head: torch.nn.Module,
    input_ids: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    chunk_size: int | None = 1024,
    temperature: float = 1.0,
    context: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob and entropy of each token of ``input_ids`` given its prefix, aligned to ``input_ids``.

    ``hidden`` ``[B, T, D]`` are the final hidden states of ``input_ids`` ``[B, T]``; entry ``[b, t]`` of
    the result is ``log p(input_ids[b, t] | input_ids[b, :t])`` (0 at ``t = 0``), the same alignment as
    ``TokenTrajectory.behaviour_logprobs``. With ``mask`` (``[B, T]``), only masked positions are computed
    (the rest are 0), which skips the LM head on prompt and observation tokens. The entropy (nats, of
    the temperature-scaled distribution) carries no gradient.

    ``context`` (a :class:`cadenza.parallel.context.ContextShare`, context parallelism): ``hidden`` holds
    only this rank's positions of the padded batch; each rank computes the tokens its hidden states
    predict and every rank gets the whole ``[B, T]`` (gradients flow back to each rank's share only).
    """
    if context is not None:
        return _shared_logprobs(hidden, lm_head, input_ids, mask, context, chunk_size, temperature)
    if hidden.shape[:2] != input_ids.shape:
        raise CadenzaError(f"hidden {tuple(hidden.shape)} does not match input_ids {tuple(input_ids.shape)}")
    B, T = input_ids.shape
    select = torch.ones((B, T), dtype=torch.bool, device=input_ids.device) if mask is None else mask.bool()
    select = select.clone()
    select[:, 0] = False
    b_idx, t_idx = select.nonzero(as_tuple=True)
    lp, ent = token_logprobs(
        hidden[b_idx, t_idx - 1],
        lm_head,
        input_ids[b_idx, t_idx],
        chunk_size=chunk_size,
        temperature=temperature,
    )
    logprobs = torch.zeros((B, T), dtype=lp.dtype, device=hidden.device)
    entropy = torch.zeros((B, T), dtype=ent.dtype, device=hidden.device)
    logprobs = logprobs.index_put((b_idx, t_idx), lp)
    entropy = entropy.index_put((b_idx, t_idx), ent)
    return logprobs, entropy


def _shared_logprobs(
    hidden: torch.Tensor,
    lm_head: torch.nn.Module,
    input_ids: torch.Tensor,
    mask: torch.Tensor | None,
    context: Any,
    chunk_size: int | None,
    temperature: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`sequence_logprobs` when ``hidden`` ``[B, Tl, D]`` sits at ``context.positions(T)``."""
    B, T = input_ids.shape
    src = context.positions(T, input_ids.device)  # hidden row j sits at global position src[j] ...
    if hidden.shape[:2] != (B, src.numel()):
        raise CadenzaError(
            f"hidden {tuple(hidden.shape)} is not this rank's share of {tuple(input_ids.shape)}"
        )
    tgt = src + 1  # ... and predicts the token at src[j] + 1
    inside = tgt < T
    select = torch.ones((B, T), dtype=torch.bool, device=input_ids.device) if mask is None else mask.bool()
    sel = torch.zeros((B, src.numel()), dtype=torch.bool, device=input_ids.device)
    sel[:, inside] = select[:, tgt[inside]]
    b_idx, j_idx = sel.nonzero(as_tuple=True)
    t_idx = tgt[j_idx]
    lp, ent = token_logprobs(
        hidden[b_idx, j_idx], lm_head, input_ids[b_idx, t_idx], chunk_size=chunk_size, temperature=temperature
    )
    logprobs = torch.zeros((B, T), dtype=lp.dtype, device=hidden.device).index_put((b_idx, t_idx), lp)
    entropy = torch.zeros((B, T), dtype=ent.dtype, device=hidden.device).index_put((b_idx, t_idx), ent)
    return context.sum(logprobs), context.sum(entropy)


def hidden_divergence(
    student_hidden: torch.Tensor,
    teacher_hidden: torch.Tensor,
    student_head: torch.nn.Module,
    teacher_head: torch.nn.Module | None = None,
    *,
    spec: DivergenceSpec = DivergenceSpec(),
    chunk_size: int | None = 1024,
) -> torch.Tensor:
    """Per-token divergence ``[N]`` between student and teacher, from hidden states ``[N, D]``.

    Same math as :func:`cadenza.rl.learn.losses.self_distillation_loss`, chunked; the teacher side is
    detached (it never receives gradient). ``teacher_head`` defaults to the student's (live teacher).
    """
    if student_hidden.shape != teacher_hidden.shape:
        raise CadenzaError("student and teacher hidden states must be aligned to the same target tokens")
    t_head = teacher_head if teacher_head is not None else student_head
    teacher_hidden = teacher_hidden.detach()

    def chunk(sh: torch.Tensor, th: torch.Tensor) -> tuple[torch.Tensor]:
        with torch.no_grad():
            t_logits = t_head(th)
        return (token_divergence(student_head(sh), t_logits, spec),)

    return _map_chunks(chunk, (student_hidden, teacher_hidden), chunk_size)[0]
