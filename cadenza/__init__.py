"""cadenza: a PyTorch-native training stack for coding agents.

Stages (each usable alone): ``tasks`` (feature-deletion task factory), ``sandbox`` and ``agent``
(tool-using episodes and hardened grading), ``monitor`` (reward-hacking detectors), ``feedback``
(hints), ``rl`` (GRPO + per-turn self-distillation), ``optim`` (granular, sharded Muon) and
``parallel`` (dual-mesh HSDP with expert and context parallelism).
"""

from cadenza.errors import CadenzaError

__all__ = ["CadenzaError", "__version__"]
__version__ = "0.1.0"
