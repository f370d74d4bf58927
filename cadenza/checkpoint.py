"""Checkpoint directories, shared by both trainers: naming, listing, atomic publish, keep-N pruning.

A checkpoint is ``<root>/step-00000012/`` (eight digits). It is written under a staging name
``<root>/.step-00000012.tmp/``, its ``meta.json`` (with at least ``step``) written last, and published
with one rename, so a crash mid-save never leaves a directory that looks complete: only directories
named ``step-N`` holding a readable ``meta.json`` count. What goes inside is the trainer's business
(safetensors + optimizer state for RL, DCP shards for pretraining). Torch-free.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from cadenza.errors import CadenzaError
from cadenza.jsonio import atomic_write_json

META = "meta.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")


def step_name(step: int) -> str:
    return f"step-{step:08d}"


def staging_path(root: str | Path, step: int) -> Path:
    return Path(root) / f".{step_name(step)}.tmp"


def staging(root: str | Path, step: int) -> Path:
    """An empty staging directory for the checkpoint of ``step`` (a leftover of a crashed save is cleared)."""
    tmp = staging_path(root, step)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def publish(tmp: str | Path, step: int, meta: dict[str, Any], *, keep: int) -> Path:
    """Write ``meta.json`` into the staged ``tmp``, rename it to ``step-N`` and keep the newest ``keep``."""
    tmp = Path(tmp)
    final = tmp.parent / step_name(step)
    atomic_write_json(tmp / META, {**meta, "step": step})
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    prune(tmp.parent, keep=keep)
    return final


def read_meta(path: str | Path) -> dict[str, Any] | None:
    """The ``meta.json`` of a complete checkpoint, or ``None`` when ``path`` is not one."""
    path = Path(path)
    if not _STEP_DIR.match(path.name):
        return None
    try:
        meta = json.loads((path / META).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and isinstance(meta.get("step"), int) else None


def list_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first."""
    root = Path(root)
    found = [(meta["step"], p) for p in (root.iterdir() if root.is_dir() else []) if (meta := read_meta(p))]
    return [p for _, p in sorted(found)]


def latest(root: str | Path) -> Path | None:
    """The newest complete checkpoint under ``root``."""
    found = list_checkpoints(root)
    return found[-1] if found else None


def require_meta(path: str | Path) -> dict[str, Any]:
    """``read_meta`` for a checkpoint the user named: one line when it is not a complete checkpoint."""
    meta = read_meta(path)
    if meta is None:
        raise CadenzaError(
            f"{path} is not a complete cadenza checkpoint (no {META}); pass a step-N directory"
        )
    return meta


def prune(root: str | Path, *, keep: int) -> None:
    """Delete all but the newest ``keep`` complete checkpoints."""
    for old in list_checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


# config.json keys that name a model's shape: a checkpoint records them and a resume must match them
ARCH_KEYS = (
    "model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "intermediate_size", "moe_intermediate_size", "num_experts",
    "n_routed_experts", "num_local_experts",
)  # fmt: skip


def model_arch(config: dict[str, Any]) -> dict[str, Any]:
    """The shape-defining entries of an HF ``config.json`` (nested ``text_config`` for multimodal ones)."""
    config = config.get("text_config") or config
    return {k: config[k] for k in ARCH_KEYS if config.get(k) is not None}
