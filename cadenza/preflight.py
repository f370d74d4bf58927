"""Prerequisite checks run before long work (``cadenza demo``, ``cadenza train``): each problem is one
:class:`CadenzaError` line saying what to do, raised in the first second instead of minutes in.

Checks are plain functions so a command composes what it needs; an engine check joins them the same way.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from cadenza.errors import CadenzaError

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
