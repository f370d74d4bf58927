"""Sharded, world-size-independent checkpoints with ``torch.distributed.checkpoint``.

Each checkpoint is ``<dir>/step-NNNNNNNN/``: DCP shards of the model and optimizer state (DTensors
keyed by the HF parameter names, so a different world size or mesh reshards on load) plus
``cadenza.json``, written by rank 0 only after every rank finished saving — a checkpoint without
it is incomplete and ignored. The model fingerprint in it stops a resume into another model.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import torch.distributed as dist
from torch import nn

from cadenza.errors import ConfigError
from cadenza.jsonio import atomic_write_json

META = "cadenza.json"


def fingerprint(model: nn.Module) -> dict:
    """Model type and a hash of every parameter's name and full shape (independent of sharding)."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(f"{name}:{tuple(p.shape)};".encode())
    config = getattr(model, "config", None)
    return {"model_type": getattr(config, "model_type", type(model).__name__), "params_sha256": h.hexdigest()}


def latest(root: str | Path) -> tuple[Path, dict] | None:
    """The newest complete checkpoint under ``root``."""
    root = Path(root)
    found = []
    for d in root.glob("step-*") if root.is_dir() else []:
        meta = d / META
        if meta.is_file():
            try:
                found.append((json.loads(meta.read_text())["step"], d))
            except (ValueError, KeyError):
                continue
    if not found:
        return None
    _, path = max(found)
    return path, json.loads((path / META).read_text())


def check_compatible(meta: dict, expected: dict, path: Path) -> None:
    if meta.get("fingerprint") != expected:
        got = meta.get("fingerprint", {}).get("model_type", "?")
        raise ConfigError(
            f"checkpoint {path} was written for a different model ({got}, other parameter shapes) "
            f"than model.path ({expected['model_type']}); use that model or another checkpoint.dir"
        )


def save(root: str | Path, step: int, model: nn.Module, optimizer, meta: dict, keep: int = 2) -> Path:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    path = Path(root) / f"step-{step:08d}"
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path))
    dist.barrier()
    if dist.get_rank() == 0:
        atomic_write_json(path / META, {**meta, "step": step})
        steps = sorted(d for d in Path(root).glob("step-*") if (d / META).is_file())
        for old in steps[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return path


def load(path: str | Path, model: nn.Module, optimizer) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
