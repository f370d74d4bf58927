"""Artifacts built once per ``pytest`` run, even when xdist splits the run over several workers.

Each xdist worker gets its own ``basetemp`` (``<run>/popen-gwN``), so a session fixture alone would build
its artifact once per worker; ``build_once`` builds it under the run's directory instead, behind a file
lock, and every later caller (in any worker) reuses it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest


def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The temporary directory of this run: shared by its xdist workers, private to the run."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def build_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]) -> Path:
    """``<run>/<name>``, made by ``build(path)`` the first time any worker asks (a failure is retried)."""
    root = run_dir(tmp_path_factory)
    out = root / name
    with open(root / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (out / ".ready").exists():
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            build(out)
            (out / ".ready").touch()
    return out
