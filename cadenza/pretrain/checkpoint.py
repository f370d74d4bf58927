"""Sharded, world-size-independent checkpoints with ``torch.distributed.checkpoint``.

Each checkpoint is ``<dir>/step-NNNNNNNN/``: DCP shards of the model and optimizer state (DTensors
keyed by the HF parameter names, so a different world size or mesh reshards on load) plus
``meta.json``. Naming, the staging directory, the atomic publish (by rank 0, only after every rank
finished saving) and pruning belong to :mod:`cadenza.checkpoint`, shared with the RL trainer. The
model fingerprint in the meta stops a resume into another model.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
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


def _state(model: nn.Module, optimizer, modules: dict[str, nn.Module] | None) -> dict:
    """What DCP saves and loads: model, optimizer and extra modules (e.g. the RL teacher), all sharded."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {
        "model": model_sd,
        "optim": optim_sd,
        **{k: get_model_state_dict(m) for k, m in (modules or {}).items()},
    }


def save(
    root: str | Path,
    step: int,
    model: nn.Module,
    optimizer,
    meta: dict,
    keep: int = 2,
    *,
    modules: dict[str, nn.Module] | None = None,
    extra: Callable[[Path], None] | None = None,
) -> Path:
    """Every rank writes its shards; ``extra(staging_dir)`` (rank 0) adds files before the publish."""
    import torch.distributed.checkpoint as dcp

    rank0 = dist.get_rank() == 0
    tmp = lifecycle.staging(root, step) if rank0 else lifecycle.staging_path(root, step)
    dist.barrier()  # the staging directory is empty before any rank writes into it
    dcp.save(_state(model, optimizer, modules), checkpoint_id=str(tmp))
    dist.barrier()
    if rank0:
        if extra is not None:
            extra(tmp)
        lifecycle.publish(tmp, step, meta, keep=keep)
    dist.barrier()
    return Path(root) / lifecycle.step_name(step)


def load(
    path: str | Path, model: nn.Module, optimizer, *, modules: dict[str, nn.Module] | None = None
) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    state = _state(model, optimizer, modules)
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    for name, module in (modules or {}).items():
        set_model_state_dict(module, state[name])
