"""Shared test setup. Tests run on CPU; distributed tests spawn real gloo process groups.

Markers (declared in pyproject.toml; ``make test`` runs everything, ``make test-fast`` none of these):
``slow`` (real task builds, long end-to-end runs), ``distributed`` (given here to every test under
``tests/distributed/``) and ``network`` (needs the package registry: skipped, with the reason, when
``pip`` cannot reach it).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

DISTRIBUTED_DIR = Path(__file__).parent / "distributed"
PROBE_PACKAGE = "cachetools"  # the package the task-factory tests build from


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).is_relative_to(DISTRIBUTED_DIR):
            item.add_marker(pytest.mark.distributed)


@functools.cache
def registry_problem() -> str | None:
    """Why the package registry cannot be used (None: it answers), probed once per session with pip."""
    cmd = [sys.executable, "-m", "pip", "index", "versions", PROBE_PACKAGE]
    cmd += ["--timeout", "10", "--retries", "0", "--disable-pip-version-check"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "pip index timed out after 60 s"
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        return lines[-1] if lines else f"pip index exited {proc.returncode}"
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("network") is not None:
        problem = registry_problem()
        if problem:
            pytest.skip(f"package registry unreachable ({problem}); this test fetches packages from it")
