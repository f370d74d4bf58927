"""Which matrices Muon orthogonalises inside one parameter.

A parameter is cut into *blocks*: boxes ``((start, stop), ...)`` over its full (unsharded) shape, each a
matrix at the model's own granularity. Blocks partition the parameter, so writing every block's update
fills the whole update.
"""

from __future__ import annotations

from collections.abc import Sequence

from cadenza.errors import ConfigError

GRANULARITIES = ("matrix", "head", "expert")
Box = tuple[tuple[int, int], ...]


def _segments(length: int, split_sizes: Sequence[int] | None, what: str) -> list[tuple[int, int]]:
    sizes = list(split_sizes) if split_sizes else [length]
    if any(int(s) <= 0 for s in sizes) or sum(sizes) != length:
        raise ConfigError(
            f"split_sizes {list(sizes)} must be positive and sum to {length} ({what}); "
            "fix split_sizes to match the fused projection"
        )
    out, start = [], 0
    for s in sizes:
        out.append((start, start + int(s)))
        start += int(s)
    return out


def blocks(
    shape: Sequence[int],
    granularity: str,
    *,
    head_dim: int | None = None,
    head_axis: int = 0,
    split_sizes: Sequence[int] | None = None,
    name: str = "parameter",
) -> list[Box]:
    """The boxes of ``shape`` that are orthogonalised separately; raises ConfigError on a bad fit."""
    shape = tuple(int(s) for s in shape)
    if granularity not in GRANULARITIES:
        raise ConfigError(f"unknown granularity {granularity!r} for {name}; use one of {GRANULARITIES}")
    if granularity == "expert":
        if len(shape) != 3:
            raise ConfigError(
                f"granularity 'expert' needs a 3-D stacked parameter [E, A, B]; {name} has shape "
                f"{list(shape)}"
            )
        E, A, B = shape
        segs = _segments(A, split_sizes, f"dim 1 of {name}")
        return [((e, e + 1), seg, (0, B)) for e in range(E) for seg in segs]
    if len(shape) != 2:
        hint = (
            " (use granularity 'expert' for stacked experts)"
            if len(shape) == 3
            else " (give 1-D parameters such as norms and biases to an 'adamw' group)"
        )
        raise ConfigError(
            f"Muon granularity {granularity!r} needs a 2-D parameter; {name} has shape {list(shape)}{hint}"
        )
    if granularity == "matrix":
        return [((0, shape[0]), (0, shape[1]))]
    if head_axis not in (0, 1):
        raise ConfigError(
            f"head_axis must be 0 (rows: q/k/v) or 1 (columns: output projection), got {head_axis}"
        )
    if head_dim is None and not split_sizes:
        raise ConfigError(f"granularity 'head' for {name} needs head_dim (or split_sizes)")
    if head_dim is not None and head_dim <= 0:
        raise ConfigError(f"head_dim must be positive, got {head_dim}")
    out: list[Box] = []
    for lo, hi in _segments(shape[head_axis], split_sizes, f"dim {head_axis} of {name}"):
        step = head_dim or (hi - lo)
        if (hi - lo) % step:
            raise ConfigError(
                f"head_dim {head_dim} does not divide {hi - lo} (dim {head_axis} of {name}, "
                f"shape {list(shape)}); set head_dim/split_sizes to the model's head layout"
            )
        for s in range(lo, hi, step):
            seg = (s, s + step)
            out.append((seg, (0, shape[1])) if head_axis == 0 else ((0, shape[0]), seg))
    return out


def box_matrix_shape(box: Box) -> tuple[int, int]:
    """``(A, B)`` of the matrix a box holds (a leading expert extent of 1 is dropped)."""
    return box[-2][1] - box[-2][0], box[-1][1] - box[-1][0]
