"""Context parallelism: head–tail sequence chunking and an all-gather attention for HF models.

The sequence is cut into ``2·cp`` equal chunks and CP rank ``r`` keeps chunks ``r`` and
``2·cp-1-r``: under a causal mask early chunks are cheap and late ones expensive, so pairing a
head chunk with a tail chunk gives every rank the same amount of attention work.

Attention runs through a function registered in transformers' ``AttentionInterface`` under
:data:`CP_ATTENTION`: it all-gathers K and V over the CP group (the backward reduce-scatters
their gradients), and masks causally using the *global* positions of the local queries and of the
gathered keys. Queries stay local, so the output has the local sequence length.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cadenza.errors import ConfigError
from cadenza.parallel.comm import all_gather

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
