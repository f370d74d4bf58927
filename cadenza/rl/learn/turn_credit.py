"""Turn-level credit without words (``loss.turn_penalty``): the control that separates *knowing which
turn failed* from *what the hint says*.

Self-distillation acts only on the turns a feedback rule flags; GRPO gives one scalar per episode. This
gives GRPO the same turn-level information: every token of a flagged turn gets its advantage lowered
by ``turn_penalty``, so the turns SD would correct are pushed down, with no text shown to anyone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def penalised_rows(episodes: Sequence[Any]) -> set[int]:
    """Rows with at least one flagged turn: they stay in the GRPO term even when their group's rewards
    are all equal (the penalty is their only signal then)."""
    return {i for i, e in enumerate(episodes) if e.hints}


def token_advantages(
    adv: torch.Tensor, episodes: Sequence[Any], rows: Sequence[int], shape: torch.Size, penalty: float
) -> torch.Tensor:
    """``[len(rows), T]`` advantages: each row's episode advantage, minus ``penalty`` on the tokens of
    its flagged turns (``Hint.turn`` indexes ``tokens.turn_spans``; positions are the collated batch's)."""
    out = adv[list(rows)].to(torch.float32)[:, None].expand(*shape).clone()
    for r, i in enumerate(rows):
        spans = episodes[i].rollout.tokens.turn_spans
        for turn in {h.turn for h in episodes[i].hints}:
            s, e = spans[turn]
            out[r, s:e] -= penalty
    return out
