"""The optimizer settings a config file holds, without torch: a bad value is one line before anything
heavy is imported (:mod:`cadenza.optim.build` turns them into optimizers)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cadenza.errors import ConfigError

OPTIMIZERS = ("adamw", "muon")
NS_DTYPE_NAMES = ("float32", "bfloat16", "float16")


@dataclass(kw_only=True)
class MuonConfig:
    """Muon per head / per expert, AdamW for the rest (the ``[muon]`` section of a pretraining config).

    With ``adjust_lr = "match_rms_adamw"`` Muon's updates have AdamW's RMS, so one lr suits both.
    """

    granular: bool = True  # per head / per expert from the HF config; false: whole matrices
    adjust_lr: str = "match_rms_adamw"  # or "original" (then the lr is Muon's own, ~0.02)
    momentum: float = 0.95  # Muon's momentum (Nesterov)
    ns_steps: int = 5  # Newton–Schulz iterations
    ns_dtype: str = "bfloat16"  # Newton–Schulz precision: bfloat16 | float32 | float16
    adamw_lr: float = 0.0  # lr of the AdamW groups (embeddings, lm_head, norms); 0 = the Muon lr

    def optimizer_options(self) -> dict[str, Any]:
        """The :class:`~cadenza.optim.muon.Muon` keyword arguments this section sets."""
        import torch

        return dict(
            momentum=self.momentum,
            adjust_lr=self.adjust_lr,
            ns_steps=self.ns_steps,
            ns_dtype=getattr(torch, self.ns_dtype),
        )

    def check(self, where: str = "muon") -> None:
        """One-line :class:`ConfigError` for a value Muon cannot use."""
        if self.adjust_lr not in ("original", "match_rms_adamw"):
            raise ConfigError(
                f"{where}.adjust_lr must be 'original' or 'match_rms_adamw', got {self.adjust_lr!r}"
            )
        if self.ns_dtype not in NS_DTYPE_NAMES:
            raise ConfigError(f"{where}.ns_dtype must be float32, bfloat16 or float16, got {self.ns_dtype!r}")
        if not 0 <= self.momentum < 1 or self.ns_steps < 1 or self.adamw_lr < 0:
            raise ConfigError(
                f"{where}.momentum must be in [0, 1), {where}.ns_steps >= 1 and {where}.adamw_lr >= 0 "
                "(0 = lr)"
            )
