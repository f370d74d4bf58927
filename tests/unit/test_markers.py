"""The test markers do what tests/conftest.py says: distributed tests are marked by folder, and the
registry probe behind ``network`` reports an unreachable index instead of passing vacuously."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.registry import registry_problem

ROOT = Path(__file__).resolve().parents[2]


def test_registry_probe_names_an_unreachable_index(monkeypatch) -> None:
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # the discard port: refused
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    problem = registry_problem.__wrapped__()
    assert problem and "\n" not in problem


def test_distributed_tests_are_marked_by_folder() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "distributed", "tests/distributed"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    collected = [line for line in proc.stdout.splitlines() if "::" in line]
    assert proc.returncode == 0 and collected and all(c.startswith("tests/distributed/") for c in collected)
