"""Checkpoints for exact resume: safetensors weights, optimizer state, every RNG, trainer state.

A checkpoint is a directory ``checkpoints/step-00000012/`` whose naming, atomic publish and pruning
belong to :mod:`cadenza.checkpoint` (shared with pretraining); this module owns what goes inside.
Resuming restores the
RNG streams (Python, NumPy, torch, and any named generators the trainer owns), so steps after a
resume sample exactly the same tokens as an uninterrupted run.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_model, save_model

from cadenza import checkpoint as lifecycle


def rng_state(generators: dict[str, Any] | None = None) -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    for name, gen in (generators or {}).items():
        state[f"gen:{name}"] = gen.getstate() if isinstance(gen, random.Random) else gen.get_state()
    return state


def set_rng_state(state: dict[str, Any], generators: dict[str, Any] | None = None) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    for name, gen in (generators or {}).items():
        s = state[f"gen:{name}"]
        gen.setstate(s) if isinstance(gen, random.Random) else gen.set_state(s)


def save_checkpoint(
    out_dir: str | Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    trainer_state: dict[str, Any] | None = None,
    modules: dict[str, torch.nn.Module] | None = None,
    generators: dict[str, Any] | None = None,
    keep: int = 2,
) -> Path:
    """Write ``out_dir/checkpoints/step-N``; ``modules`` are extra weights (e.g. an EMA teacher)."""
    tmp = lifecycle.staging(Path(out_dir) / "checkpoints", step)
    save_model(model, str(tmp / "model.safetensors"))
    for name, mod in (modules or {}).items():
        save_model(mod, str(tmp / f"{name}.safetensors"))
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save({"rng": rng_state(generators), "trainer": trainer_state or {}}, tmp / "state.pt")
    meta = {"modules": sorted(modules or {}), "arch": arch_of(model)}
    return lifecycle.publish(tmp, step, meta, keep=keep)


def arch_of(model: torch.nn.Module) -> dict[str, Any]:
    """The model's shape-defining config entries, recorded in ``meta.json`` (checked before a resume)."""
    config = getattr(model, "config", None)
    return lifecycle.model_arch(config.to_dict()) if hasattr(config, "to_dict") else {}


def list_checkpoints(out_dir: str | Path) -> list[Path]:
    return lifecycle.list_checkpoints(Path(out_dir) / "checkpoints")


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    return lifecycle.latest(Path(out_dir) / "checkpoints")


def load_checkpoint(
    path: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    modules: dict[str, torch.nn.Module] | None = None,
    generators: dict[str, Any] | None = None,
) -> tuple[int, dict[str, Any]]:
    """Restore everything in place; return ``(step, trainer_state)``."""
    path = Path(path)
    meta = lifecycle.require_meta(path)
    if meta.get("format") == "dcp":
        from cadenza.errors import ConfigError

        raise ConfigError(
            f"checkpoint {path} holds DCP shards of a run under torchrun; resume it under torchrun "
            "(any world size > 1), or use another run.out_dir"
        )
    load_model(model, str(path / "model.safetensors"))
    for name, mod in (modules or {}).items():
        load_model(mod, str(path / f"{name}.safetensors"))
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=False))
    state = torch.load(path / "state.pt", weights_only=False)
    set_rng_state(state["rng"], generators)
    return int(meta["step"]), state["trainer"]
