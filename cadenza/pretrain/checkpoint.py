"""Sharded, world-size-independent checkpoints with ``torch.distributed.checkpoint``.

Each checkpoint is ``<dir>/step-NNNNNNNN/``: DCP shards of the model and optimizer state (DTensors
keyed by the HF parameter names, so a different world size or mesh reshards on load) plus
``meta.json``. Naming, the staging directory, the atomic publish (by rank 0, only after every rank
finished saving) and pruning belong to :mod:`cadenza.checkpoint`, shared with the RL trainer. The
model fingerprint in the meta stops a resume into another model.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch.distributed as dist
from torch import nn

from cadenza import checkpoint as lifecycle
from cadenza.errors import ConfigError


def fingerprint(model: nn.Module) -> dict:
    """Model type and a hash of every parameter's name and full shape (independent of sharding)."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(f"{name}:{tuple(p.shape)};".encode())
    config = getattr(model, "config", None)
    return {"model_type": getattr(config, "model_type", type(model).__name__), "params_sha256": h.hexdigest()}


def latest(root: str | Path) -> tuple[Path, dict] | None:
    """The newest complete checkpoint under ``root`` and its meta."""
    path = lifecycle.latest(root)
    return None if path is None else (path, lifecycle.require_meta(path))


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

    rank0 = dist.get_rank() == 0
    tmp = lifecycle.staging(root, step) if rank0 else lifecycle.staging_path(root, step)
    dist.barrier()  # the staging directory is empty before any rank writes into it
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
    dist.barrier()
    if rank0:
        lifecycle.publish(tmp, step, meta, keep=keep)
    dist.barrier()
    return Path(root) / lifecycle.step_name(step)


def load(path: str | Path, model: nn.Module, optimizer) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
