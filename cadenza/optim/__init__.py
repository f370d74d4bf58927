"""Newton–Schulz, granular Muon (matrix / head / expert) with AdamW groups, its sharded runtime, and
global gradient clipping across meshes."""

from cadenza.optim.clip import clip_grad_norm_, total_grad_norm
from cadenza.optim.granularity import blocks
from cadenza.optim.groups import assign, muon_param_groups, print_assignment
from cadenza.optim.muon import Muon, adjusted_ratio
from cadenza.optim.newton_schulz import DEFAULT_COEFFICIENTS, newton_schulz
from cadenza.optim.runtime import run_jobs

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
