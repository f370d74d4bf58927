"""Batched Newton–Schulz orthogonalisation, the whole cost of a Muon step.

Kept as a pure function over ``[..., A, B]`` so the same code serves one matrix, a stack of heads or
experts, and the batches that the sharded runtime assembles from shards.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from cadenza.errors import ConfigError

DEFAULT_COEFFICIENTS: tuple[float, float, float] = (3.4445, -4.7750, 2.0315)

Coefficients = tuple[float, float, float] | Sequence[tuple[float, float, float]]


def coefficient_schedule(coefficients: Coefficients, steps: int) -> list[tuple[float, float, float]]:
    """One ``(a, b, c)`` per step: a single triple repeats; a schedule (Polar Express) repeats its last
    entry."""
    if steps < 1:
        raise ConfigError(f"ns_steps must be >= 1, got {steps}")
    coeffs = list(coefficients)
    if len(coeffs) == 3 and all(isinstance(c, int | float) for c in coeffs):
        return [tuple(float(c) for c in coeffs)] * steps  # type: ignore[list-item]
    if not coeffs or any(len(c) != 3 for c in coeffs):
        raise ConfigError("ns_coefficients must be (a, b, c) or a non-empty list of (a, b, c) triples")
    triples = [tuple(float(x) for x in c) for c in coeffs]
    return [triples[min(i, len(triples) - 1)] for i in range(steps)]  # type: ignore[misc]


def newton_schulz(
    X: torch.Tensor,
    steps: int = 5,
    coefficients: Coefficients = DEFAULT_COEFFICIENTS,
    dtype: torch.dtype = torch.bfloat16,
    eps: float = 1e-7,
) -> torch.Tensor:
    """Approximately orthogonalise each matrix in ``X[..., A, B]`` (returns ``dtype``, same shape).

    Each matrix is divided by its Frobenius norm (clamped at ``eps``), transposed when ``A > B`` so the
    Gram matrix is the small side, then iterated ``S = X Xᵀ; X = a X + (b S + c S S) X``.
    """
    if X.ndim < 2:
        raise ConfigError(f"newton_schulz needs a matrix or a batch of matrices, got shape {tuple(X.shape)}")
    schedule = coefficient_schedule(coefficients, steps)
    lead, (A, B) = X.shape[:-2], X.shape[-2:]
    Y = X.to(dtype=dtype, copy=True)
    if X.ndim > 3:
        Y = Y.reshape(-1, A, B)
    if A > B:
        Y = Y.mT
    batched = Y.ndim == 3
    if batched:
        Y = Y / torch.linalg.vector_norm(Y, dim=(-2, -1), keepdim=True).clamp(min=eps)
    else:  # same reduction as torch.optim.Muon, so a single matrix matches it exactly
        Y = Y / Y.norm().clamp(min=eps)
    mm = torch.baddbmm if batched else torch.addmm
    for a, b, c in schedule:
        S = Y @ Y.mT
        P = mm(S, S, S, beta=b, alpha=c)
        Y = mm(Y, P, Y, beta=a)
    if A > B:
        Y = Y.mT
    return Y.reshape(*lead, A, B)


def ns_flops(A: int, B: int, steps: int = 5) -> float:
    """Multiply-add FLOPs of ``steps`` iterations on one ``A x B`` matrix (m = min side, n = max side)."""
    m, n = min(A, B), max(A, B)
    return float(steps) * (2 * m * m * n + 2 * m * m * m + 2 * m * m * n)
