"""Learning-rate schedules as pure functions of the step, so resuming needs no scheduler state."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cadenza.pretrain.config import PretrainLoopConfig


def lr_at(
    step: int,
    *,
    steps: int,
    lr: float,
    warmup_steps: int = 0,
    schedule: str = "cosine",
    min_lr_ratio: float = 0.1,
    decay_fraction: float = 0.2,
) -> float:
    """LR for 1-based ``step``: linear warmup, then cosine decay, WSD (stable then linear decay) or
    constant."""
    if warmup_steps and step <= warmup_steps:
        return lr * step / warmup_steps
    floor = lr * min_lr_ratio
    if schedule == "constant":
        return lr
    if schedule == "cosine":
        span = max(steps - warmup_steps, 1)
        progress = min(max(step - warmup_steps, 0) / span, 1.0)
        return floor + (lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    if schedule == "wsd":
        decay_steps = max(1, round(steps * decay_fraction))
        decay_start = steps - decay_steps
        if step <= decay_start:
            return lr
        return lr - (lr - floor) * min((step - decay_start) / decay_steps, 1.0)
    raise ValueError(f"unknown schedule {schedule!r}")


def schedule_of(config: PretrainLoopConfig) -> Callable[[int], float]:
    """:func:`lr_at` with every setting read from ``config``'s fields of the same names (``[train]``)."""
    names = [n for n in inspect.signature(lr_at).parameters if n != "step"]
    return functools.partial(lr_at, **{n: getattr(config, n) for n in names})
