"""Newton–Schulz, granular Muon (matrix / head / expert) with AdamW groups, its sharded runtime, and
global gradient clipping across meshes.

The names are loaded on first use (PEP 562), so :mod:`cadenza.optim.config` (what config files hold)
is importable without torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cadenza.lazy import lazy_package

if TYPE_CHECKING:
    from cadenza.optim.clip import clip_grad_norm_, total_grad_norm
    from cadenza.optim.granularity import blocks
    from cadenza.optim.groups import assign, muon_param_groups, print_assignment
    from cadenza.optim.muon import Muon, adjusted_ratio
    from cadenza.optim.newton_schulz import DEFAULT_COEFFICIENTS, newton_schulz
    from cadenza.optim.runtime import run_jobs

_HOME = {
    "clip_grad_norm_": "clip",
    "total_grad_norm": "clip",
    "blocks": "granularity",
    "assign": "groups",
    "muon_param_groups": "groups",
    "print_assignment": "groups",
    "Muon": "muon",
    "adjusted_ratio": "muon",
    "DEFAULT_COEFFICIENTS": "newton_schulz",
    "newton_schulz": "newton_schulz",
    "run_jobs": "runtime",
}

__all__ = [
    "DEFAULT_COEFFICIENTS",
    "Muon",
    "adjusted_ratio",
    "assign",
    "blocks",
    "clip_grad_norm_",
    "muon_param_groups",
    "newton_schulz",
    "print_assignment",
    "run_jobs",
    "total_grad_norm",
]


lazy_package(__name__, _HOME)
