"""Optimizers by name, so a config can switch between AdamW and cadenza's Muon without code changes."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from cadenza.errors import ConfigError
from cadenza.pretrain.config import MuonConfig

NS_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Matrices decay; vectors (norms, biases) do not."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    rest = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def _adamw(
    model: nn.Module,
    *,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
    muon: MuonConfig | None = None,
) -> torch.optim.Optimizer:
    # foreach=False: parameters live on two meshes, and a fused foreach op cannot mix DTensor meshes.
    return torch.optim.AdamW(_param_groups(model, weight_decay), lr=lr, betas=betas, foreach=False)


def _hf_model(model: nn.Module) -> nn.Module:
    """The HF model inside a ParallelCausalLM (its config names the architecture), else ``model``."""
    from cadenza.parallel import ParallelCausalLM

    return model.model if isinstance(model, ParallelCausalLM) else model


def muon_groups(
    model: nn.Module, *, lr: float, weight_decay: float, muon: MuonConfig
) -> list[dict[str, Any]]:
    """:func:`cadenza.optim.muon_param_groups` for the HF model, with AdamW's vectors kept out of weight
    decay and every group's ``lr_scale`` (its lr relative to ``train.lr``, which the schedule scales)."""
    from cadenza.optim import muon_param_groups

    groups = []
    for g in muon_param_groups(_hf_model(model), granular=muon.granular):
        if g["algorithm"] == "muon":
            groups.append({**g, "lr_scale": 1.0})
            continue
        scale = (muon.adamw_lr / lr) if muon.adamw_lr else 1.0
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


def _muon(
    model: nn.Module,
    *,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
    muon: MuonConfig | None = None,
) -> torch.optim.Optimizer:
    try:
        module = importlib.import_module("cadenza.optim.muon")
    except ModuleNotFoundError:
        raise ConfigError(
            "train.optimizer='muon' needs cadenza.optim.muon, which this build lacks; use optimizer='adamw'"
        ) from None
    muon = muon or MuonConfig()
    groups = muon_groups(model, lr=lr, weight_decay=weight_decay, muon=muon)
    for g in groups:
        g["lr"] = lr * g["lr_scale"]
    return module.Muon(
        groups,
        lr=lr,
        weight_decay=weight_decay,
        betas=betas,
        momentum=muon.momentum,
        adjust_lr=muon.adjust_lr,
        ns_steps=muon.ns_steps,
        ns_dtype=NS_DTYPES[muon.ns_dtype],
    )


OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {"adamw": _adamw, "muon": _muon}


def build_optimizer(
    name: str,
    model: nn.Module,
    *,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.95),
    muon: MuonConfig | None = None,
) -> torch.optim.Optimizer:
    """``muon`` configures the ``"muon"`` optimizer (ignored by AdamW)."""
    if name not in OPTIMIZERS:
        raise ConfigError(f"unknown train.optimizer {name!r}; choose one of {sorted(OPTIMIZERS)}")
    return OPTIMIZERS[name](model, lr=lr, weight_decay=weight_decay, betas=betas, muon=muon)
