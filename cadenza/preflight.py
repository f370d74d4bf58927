"""Prerequisite checks run before long work (``cadenza demo``, ``cadenza train``): each problem is one
:class:`CadenzaError` line saying what to do, raised in the first second instead of minutes in.

Checks are plain functions so a command composes what it needs; an engine check joins them the same way.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cadenza.checkpoint import model_arch
from cadenza.errors import CadenzaError, ConfigError

MIN_PYTHON = (3, 11)


def check_python() -> None:
    if sys.version_info < MIN_PYTHON:
        have = ".".join(map(str, sys.version_info[:3]))
        raise CadenzaError(f"cadenza needs Python >= 3.11, this is {have}; install a newer Python")


TRAIN_PACKAGES = ("torch", "transformers", "tokenizers", "safetensors", "numpy")


def check_train_extra() -> None:
    """The ``train`` extra is installed (``pip install cadenza`` alone runs the task factory only)."""
    missing = [name for name in TRAIN_PACKAGES if not _installed(name)]
    if missing:
        raise CadenzaError(
            f"this command trains a model and needs {', '.join(missing)}; run: pip install 'cadenza[train]'"
        )


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a broken or blocked install counts as missing
        return False


def check_sandbox() -> None:
    """bubblewrap is installed and can create namespaces here (the sandbox's own probe, on a scratch dir)."""
    from cadenza.sandbox.runner import Sandbox

    with tempfile.TemporaryDirectory(prefix="cadenza-preflight-") as scratch:
        Sandbox(scratch)


def free_gib(path: Path) -> float:
    """Free space on the filesystem that holds ``path`` (or would, once created)."""
    probe = Path(path).absolute()
    while not probe.exists():
        probe = probe.parent
    return shutil.disk_usage(probe).free / 2**30


def check_disk(path: Path, need_gib: float) -> None:
    have = free_gib(path)
    if have < need_gib:
        raise CadenzaError(
            f"only {have:.1f} GiB free under {path}, this run needs about {need_gib:g} GiB; "
            "free some space or choose another output directory"
        )


def run_checks(checks: list[Callable[[], None]]) -> None:
    """Run ``checks`` in order; the first failure raises its one-line error."""
    for check in checks:
        check()


def for_demo(out: Path, *, sandboxed: bool = True) -> None:
    """``cadenza demo``: task environments, a policy and a run directory under ``out``; episodes sandboxed."""
    checks = [check_python, lambda: check_disk(out, DEMO_DISK_GIB)]
    if sandboxed:  # the full demo trains a policy in sandboxed episodes; --tasks-only builds tasks only
        checks[1:1] = [check_train_extra, check_sandbox]
    run_checks(checks)


def for_train(out: Path, *, sandboxed: bool) -> None:
    """``cadenza train``: checkpoints under ``out``; the sandbox only when the environment uses it."""
    checks = [check_python, check_train_extra, lambda: check_disk(out, TRAIN_DISK_GIB)]
    if sandboxed:
        checks.insert(2, check_sandbox)
    run_checks(checks)


def for_pretrain(out: Path) -> None:
    """``cadenza pretrain``: checkpoints and the tokenized corpus under ``out``."""
    run_checks([check_python, check_train_extra, lambda: check_disk(out, TRAIN_DISK_GIB)])


DEMO_DISK_GIB = 2.0  # task venvs (~0.3 GiB), the tiny policy and its checkpoints, with a margin
TRAIN_DISK_GIB = 1.0  # checkpoints of a small model; real models need more and say so when saving


# ---------------------------------------------------------------- cadenza train under torchrun
# Every rank checks the launch on the config and the files alone (the model's ``config.json``, the newest
# checkpoint's ``meta.json``), before it joins the group or loads a model: a ``[parallel]`` table that
# cannot fit the world, an ``ep`` that does not divide the experts, or a checkpoint written for another
# model ends the job with one line from rank 0 (the others leave silently with the same exit code).
# ``parallel.*`` may differ from the checkpointed run's: DCP reshards on load.

_EXPERT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts")


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


def for_launch(cfg: Any, *, resume: bool) -> None:
    """:func:`check_launch` on this launch's world size: rank 0 raises, the other ranks exit quietly."""
    world = int(os.environ.get("WORLD_SIZE", "1")) if "RANK" in os.environ else 1
    try:
        check_launch(cfg, world, resume=resume)
    except ConfigError:
        if int(os.environ.get("RANK", "0")) != 0:
            raise SystemExit(2) from None
        raise
