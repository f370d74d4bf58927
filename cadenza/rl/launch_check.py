"""Checks of a ``cadenza train`` launch that run before any rank joins the group or loads a model.

Under torchrun every rank runs them on the config and the files alone (the model's ``config.json``, the
newest checkpoint's ``meta.json``), so a ``[parallel]`` table that cannot fit the world, an ``ep`` that
does not divide the experts, or a checkpoint written for another model ends the job with one line from
rank 0 (the others leave silently with the same exit code) instead of N tracebacks after minutes of
loading. ``parallel.*`` may differ from the checkpointed run's: DCP reshards on load.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from cadenza.errors import ConfigError

# config.json keys that name a model's shape: a checkpoint records them and a resume must match them
ARCH_KEYS = (
    "model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "intermediate_size", "moe_intermediate_size", "num_experts",
    "n_routed_experts", "num_local_experts",
)  # fmt: skip
_EXPERT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts")


def model_arch(config: dict[str, Any]) -> dict[str, Any]:
    """The shape-defining entries of an HF ``config.json`` (nested ``text_config`` for multimodal ones)."""
    config = config.get("text_config") or config
    return {k: config[k] for k in ARCH_KEYS if config.get(k) is not None}


def _model_config(path: str) -> dict[str, Any] | None:
    file = Path(path) / "config.json" if path else None
    if file is None or not file.is_file():
        return None
    return json.loads(file.read_text())


def check_launch(cfg: Any, world: int, *, resume: bool) -> None:
    """Raise :class:`ConfigError` (one line) when the launch cannot work; see the module docstring."""
    dims = cfg.parallel.resolve(world) if world > 1 else None
    model = _model_config(cfg.model.path)
    arch = model_arch(model) if model is not None else {}
    if dims is not None and dims.ep > 1 and model is not None:
        experts = next((arch[k] for k in _EXPERT_KEYS if k in arch), None)
        if experts is None:
            raise ConfigError(
                f"parallel.ep = {dims.ep} but {cfg.model.path}/config.json names no routed experts; "
                "use ep = 1 for dense models"
            )
        if experts % dims.ep:
            raise ConfigError(
                f"parallel.ep = {dims.ep} does not divide the number of experts ({experts}) of "
                f"{cfg.model.path}; choose ep among the divisors of {experts}"
            )
    if resume and arch:
        _check_checkpoint_model(Path(cfg.run.out_dir), arch)


def _check_checkpoint_model(out: Path, arch: dict[str, Any]) -> None:
    from cadenza import checkpoint as lifecycle

    newest = lifecycle.latest(out / "checkpoints")
    meta = lifecycle.read_meta(newest) if newest is not None else None
    if not meta:
        return
    saved = meta.get("arch") or {}
    if not saved and "fingerprint" in meta:  # older checkpoints record the model type only
        saved = {"model_type": meta["fingerprint"].get("model_type")}
    diff = next((k for k in saved if k in arch and saved[k] != arch[k]), None)
    if diff is not None:
        raise ConfigError(
            f"checkpoint {newest} was written for another model ({diff} {saved[diff]!r}, the model has "
            f"{arch[diff]!r}); use another run.out_dir, or --no-resume to start over"
        )


def preflight(cfg: Any, *, resume: bool) -> None:
    """:func:`check_launch` on this launch's world size: rank 0 raises, the other ranks exit quietly."""
    world = int(os.environ.get("WORLD_SIZE", "1")) if "RANK" in os.environ else 1
    try:
        check_launch(cfg, world, resume=resume)
    except ConfigError:
        if int(os.environ.get("RANK", "0")) != 0:
            raise SystemExit(2) from None
        raise
