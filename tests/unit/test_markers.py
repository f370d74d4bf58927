"""The test markers do what tests/conftest.py says: distributed tests are marked by folder, and the
registry probe behind ``network`` reports an unreachable index instead of passing vacuously."""

from __future__ import annotations

import os
import re
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


# What a test module writes when it starts a vLLM engine or a Ray cluster (directly or through the CLI).
STARTS_ENGINE = re.compile(
    r'engine="vllm"|make_engine\(\s*"vllm"|kind="ray"|executor="ray"|"--executor", "ray"|RayWorkers\('
)


def test_modules_that_start_engines_or_ray_are_marked_serial() -> None:
    """They share one xdist worker (tests/conftest.py); an unmarked one would run beside another engine."""
    starting = [
        p
        for p in (ROOT / "tests").rglob("test_*.py")
        if "unit" not in p.parts and STARTS_ENGINE.search(p.read_text())
    ]
    assert len(starting) >= 9, starting  # the vLLM, Ray and served-worker modules: the pattern still matches
    unmarked = [str(p.relative_to(ROOT)) for p in starting if "pytest.mark.serial" not in p.read_text()]
    assert not unmarked, f"mark these modules pytest.mark.serial (they start an engine or Ray): {unmarked}"


def test_serial_tests_share_one_worker_and_modules_stay_whole(tmp_path) -> None:
    """The grouping of tests/conftest.py under ``make test``'s xdist options (it silently stops working with
    a pytest whose node ids xdist cannot tag, pytest-xdist#1386)."""
    for name in ("a", "b"):
        body = "import pytest\n\npytestmark = pytest.mark.serial\n"
        (tmp_path / f"test_{name}.py").write_text(
            body + "".join(f"\ndef test_{i}():\n    pass\n" for i in range(4))
        )
    (tmp_path / "test_c.py").write_text("".join(f"def test_{i}():\n    pass\n\n" for i in range(8)))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-n", "3", "--dist", "loadgroup", "-v", "."],
        cwd=tmp_path,
        env={**{k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    ran = re.findall(r"\[(gw\d+)\] .*PASSED (test_\w)\.py", proc.stdout)
    assert proc.returncode == 0 and len(ran) == 16, proc.stdout[-3000:]
    assert len({gw for gw, mod in ran if mod != "test_c"}) == 1, ran
    assert len({gw for gw, mod in ran if mod == "test_c"}) == 1, ran
