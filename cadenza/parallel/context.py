"""Context parallelism: head–tail sequence chunking and an all-gather attention for HF models.

The sequence is cut into ``2·cp`` equal chunks and CP rank ``r`` keeps chunks ``r`` and
``2·cp-1-r``: under a causal mask early chunks are cheap and late ones expensive, so pairing a
head chunk with a tail chunk gives every rank the same amount of attention work.

Attention runs through a function registered in transformers' ``AttentionInterface`` under
:data:`CP_ATTENTION`: it all-gathers K and V over the CP group (the backward reduce-scatters
their gradients), and masks causally using the *global* positions of the local queries and of the
gathered keys. Queries stay local, so the output has the local sequence length.

:class:`ContextShare` is the same split for sequences of any length (RL microbatches are padded per
batch): right-pad to a multiple of ``2·cp``, keep this rank's positions, gather hidden states back,
and sum per-token values whose shares live on different ranks (:func:`cadenza.parallel.comm.sum_shares`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from cadenza.errors import ConfigError
from cadenza.parallel.comm import all_gather, sum_shares

CP_ATTENTION = "cadenza_cp"


def check_seq_len(seq_len: int, cp: int) -> None:
    if seq_len % (2 * cp):
        raise ConfigError(
            f"sequence length {seq_len} is not divisible by 2·cp = {2 * cp}; "
            f"pad or pack sequences to a multiple of {2 * cp}"
        )


def head_tail_positions(seq_len: int, cp: int, rank: int) -> torch.Tensor:
    """Global positions held by CP rank ``rank``: chunk ``rank`` then chunk ``2·cp-1-rank``."""
    check_seq_len(seq_len, cp)
    chunk = seq_len // (2 * cp)
    head = torch.arange(rank * chunk, (rank + 1) * chunk)
    tail = torch.arange((2 * cp - 1 - rank) * chunk, (2 * cp - rank) * chunk)
    return torch.cat([head, tail])


def gathered_positions(local_len: int, cp: int) -> torch.Tensor:
    """Global positions of a rank-ordered all-gather of every rank's local chunks."""
    return torch.cat([head_tail_positions(local_len * cp, cp, r) for r in range(cp)])


def shard_sequence(x: torch.Tensor, cp: int, rank: int, dim: int = 1) -> torch.Tensor:
    """This rank's head–tail share of ``x`` along ``dim``."""
    return x.index_select(dim, head_tail_positions(x.shape[dim], cp, rank).to(x.device))


@dataclass(frozen=True)
class ContextShare:
    """This rank's share of the sequence dim in its CP group, for sequences of any length.

    A length ``T`` is right-padded to :meth:`padded_len` (a multiple of ``2·cp``); the padding sits after
    every real token, so causal attention never lets a real token see it, and no target lies in it.
    """

    group: Any  # the CP process group
    size: int  # cp
    rank: int  # this rank's place in the CP group

    def padded_len(self, seq_len: int) -> int:
        n = 2 * self.size
        return -(-seq_len // n) * n

    def positions(self, seq_len: int, device: Any = None) -> torch.Tensor:
        """Global positions (into the padded length) this rank holds: its head chunk, then its tail chunk."""
        positions = head_tail_positions(self.padded_len(seq_len), self.size, self.rank)
        return positions if device is None else positions.to(device)

    def split(self, x: torch.Tensor, pad_value: float = 0, dim: int = 1) -> torch.Tensor:
        """This rank's share of ``x`` along ``dim``, after padding ``x`` there with ``pad_value``."""
        n = x.shape[dim]
        pad = self.padded_len(n) - n
        if pad:
            shape = list(x.shape)
            shape[dim] = pad
            x = torch.cat([x, x.new_full(shape, pad_value)], dim=dim)
        return x.index_select(dim, self.positions(n, x.device))

    @torch.no_grad()
    def gather(self, local: torch.Tensor, seq_len: int, dim: int = 1) -> torch.Tensor:
        """Every rank's share of a sequence (no gradient), back in global order and cut to ``seq_len``."""
        full = all_gather(local.contiguous(), self.group, dim=dim)
        order = gathered_positions(local.shape[dim], self.size).to(local.device).argsort()
        return full.index_select(dim, order).narrow(dim, 0, seq_len)

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        """The whole tensor from every rank's share (zeros elsewhere); gradients stay with the shares."""
        return sum_shares(x, self.group)


def cp_attention_forward(
    module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    **kwargs,
):
    """Attention for HF modules whose queries hold this rank's head–tail chunks (see module doc)."""
    group, cp, rank = module._cadenza_cp
    local_len = query.shape[2]
    key = all_gather(key, group, dim=2)
    value = all_gather(value, group, dim=2)
    q_pos = head_tail_positions(local_len * cp, cp, rank).to(query.device)
    k_pos = gathered_positions(local_len, cp).to(query.device)
    mask = k_pos[None, :] <= q_pos[:, None]
    if sliding_window is not None:
        mask &= (q_pos[:, None] - k_pos[None, :]) < sliding_window
    n_rep = query.shape[1] // key.shape[1]
    if n_rep > 1:
        key = key.repeat_interleave(n_rep, dim=1)
        value = value.repeat_interleave(n_rep, dim=1)
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout if module.training else 0.0, scale=scaling
    )
    return out.transpose(1, 2).contiguous(), None


def register_cp_attention() -> str:
    """Register :func:`cp_attention_forward` with transformers; returns its implementation name."""
    from transformers import AttentionInterface

    AttentionInterface.register(CP_ATTENTION, cp_attention_forward)
    return CP_ATTENTION
