"""The one optimizer builder of RL and pretraining: AdamW, or cadenza's Muon on the matrix groups (at the
model's own granularity) with AdamW for the embeddings, head and vectors."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from cadenza.errors import ConfigError
from cadenza.optim.config import OPTIMIZERS, MuonConfig
from cadenza.optim.groups import muon_param_groups
from cadenza.optim.muon import Muon

NS_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _decay_split(params: list[nn.Parameter], weight_decay: float) -> list[dict[str, Any]]:
    """Matrices decay; vectors (norms, biases) do not."""
    decay = [p for p in params if p.ndim >= 2]
    rest = [p for p in params if p.ndim < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def _adamw(
    model: nn.Module, *, lr: float, weight_decay: float, betas: tuple[float, float], decay_vectors: bool
) -> torch.optim.Optimizer:
    if decay_vectors:
        return torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, weight_decay=weight_decay)
    params = [p for p in model.parameters() if p.requires_grad]
    # foreach=False: FSDP2 parameters live on two meshes, and a fused foreach op cannot mix DTensor meshes.
    foreach = False if any(isinstance(p, DTensor) for p in params) else None
    return torch.optim.AdamW(_decay_split(params, weight_decay), lr=lr, betas=betas, foreach=foreach)


def muon_groups(
    model: nn.Module, *, lr: float, weight_decay: float, muon: MuonConfig, decay_vectors: bool = False
) -> list[dict[str, Any]]:
    """:func:`cadenza.optim.muon_param_groups` for an HF model, each group with its ``lr`` and ``lr_scale``
    (its lr relative to ``lr``, which a schedule scales); AdamW's vectors decay only if ``decay_vectors``."""
    adamw_lr = muon.adamw_lr or lr
    scale = (muon.adamw_lr / lr) if muon.adamw_lr else 1.0
    groups = []
    raw = muon_param_groups(model, granular=muon.granular, adamw_lr=adamw_lr, adamw_weight_decay=weight_decay)
    for g in raw:
        if g["algorithm"] == "muon":
            groups.append({**g, "lr": lr, "lr_scale": 1.0})
            continue
        if decay_vectors:
            groups.append({**g, "lr_scale": scale})
            continue
        pairs = list(zip(g["params"], g["param_names"], strict=True))
        for decays in (True, False):
            sel = [(p, n) for p, n in pairs if (p.ndim >= 2) == decays]
            if sel:
                groups.append(
                    {
                        **g,
                        "params": [p for p, _ in sel],
                        "param_names": [n for _, n in sel],
                        "weight_decay": weight_decay if decays else 0.0,
                        "lr_scale": scale,
                    }
                )
    return groups


def build_optimizer(
    name: str,
    model: nn.Module,
    *,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.95),
    muon: MuonConfig | None = None,
    decay_vectors: bool = False,
) -> torch.optim.Optimizer:
    """``name`` is ``"adamw"`` or ``"muon"`` (configured by ``muon``; ``lr`` is then Muon's lr and
    ``muon.adamw_lr`` AdamW's). ``model`` is the HF model (its config names the architecture), whose
    parameters may be FSDP2 DTensors. ``decay_vectors``: weight decay on norms and biases too."""
    if name not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer {name!r}; choose one of {list(OPTIMIZERS)}")
    if name == "adamw":
        return _adamw(model, lr=lr, weight_decay=weight_decay, betas=betas, decay_vectors=decay_vectors)
    muon = muon or MuonConfig()
    groups = muon_groups(model, lr=lr, weight_decay=weight_decay, muon=muon, decay_vectors=decay_vectors)
    return Muon(groups, lr=lr, weight_decay=weight_decay, betas=betas, **muon.optimizer_options())
