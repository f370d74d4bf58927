"""Optimizers by name, so a config can switch between AdamW and cadenza's Muon without code changes."""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch
from torch import nn

from cadenza.errors import ConfigError


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Matrices decay; vectors (norms, biases) do not."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    rest = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def _adamw(model: nn.Module, *, lr: float, weight_decay: float, betas: tuple[float, float]) -> torch.optim.Optimizer:
    # foreach=False: parameters live on two meshes, and a fused foreach op cannot mix DTensor meshes.
    return torch.optim.AdamW(_param_groups(model, weight_decay), lr=lr, betas=betas, foreach=False)


def _muon(model: nn.Module, *, lr: float, weight_decay: float, betas: tuple[float, float]) -> torch.optim.Optimizer:
    try:
        module = importlib.import_module("cadenza.optim.muon")
    except ModuleNotFoundError:
        raise ConfigError("train.optimizer='muon' needs cadenza.optim.muon, which this build lacks; "
                          "use optimizer='adamw'") from None
    return module.Muon(list(model.parameters()), lr=lr, weight_decay=weight_decay)


OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {"adamw": _adamw, "muon": _muon}


def build_optimizer(name: str, model: nn.Module, *, lr: float, weight_decay: float,
                    betas: tuple[float, float] = (0.9, 0.95)) -> torch.optim.Optimizer:
    if name not in OPTIMIZERS:
        raise ConfigError(f"unknown train.optimizer {name!r}; choose one of {sorted(OPTIMIZERS)}")
    return OPTIMIZERS[name](model, lr=lr, weight_decay=weight_decay, betas=betas)
