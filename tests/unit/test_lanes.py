"""The engine lanes under ``make test``: a missing vLLM or Ray fails the test (so CI cannot pass without
the engines), elsewhere it skips with the reason; the Makefile's test target sets the switch."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.lanes import REQUIRE_ENV, decide, engines_required

ROOT = Path(__file__).resolve().parents[2]


def test_a_missing_component_skips_by_default_and_fails_when_required() -> None:
    assert decide("ray", present=True, required=True) is None
    kind, why = decide("vllm", present=False, required=False)
    assert kind == "skip" and "cadenza.rl.engines.install" in why
    kind, why = decide("vllm", present=False, required=True)
    assert kind == "fail" and REQUIRE_ENV in why
    assert decide("ray", present=False, required=True)[0] == "fail"


def test_the_switch_and_the_makefile() -> None:
    assert not engines_required({}) and not engines_required({REQUIRE_ENV: "0"})
    assert engines_required({REQUIRE_ENV: "1"})
    make = (ROOT / "Makefile").read_text()
    test_recipe = make.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert re.search(rf"{REQUIRE_ENV}=1\b", test_recipe), test_recipe


def test_the_conftest_fails_a_ray_lane_test_when_ray_is_required_but_missing(tmp_path) -> None:
    """Through pytest itself: the Ray lane's test, with ``ray`` made unimportable, skips by default and
    fails under the switch (the real conftest hooks, the real marker)."""
    (tmp_path / "test_lane.py").write_text(
        textwrap.dedent(
            """
            import pytest

            @pytest.mark.serial("ray")
            def test_needs_a_cluster():
                pass
            """
        )
    )
    (tmp_path / "sitecustomize.py").write_text(
        "import importlib.util as u\n_find = u.find_spec\n"
        "u.find_spec = lambda name, *a, **k: None if name == 'ray' else _find(name, *a, **k)\n"
    )
    # the project's conftest as this directory's, so that its hooks run on the test above
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa: F403\n")
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)]
    env = {"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"}
    skipped = subprocess.run(
        [*base, "-rs"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert "1 skipped" in skipped.stdout and "ray is not installed" in skipped.stdout, skipped.stdout[-2000:]
    env[REQUIRE_ENV] = "1"
    failed = subprocess.run(base, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    # a failure in setup: pytest counts it as an error, and the run fails
    assert failed.returncode == 1 and "1 error" in failed.stdout, failed.stdout[-2000:]
    assert REQUIRE_ENV in failed.stdout


#: calls that reach the package registry (a base env's pip installs, an isolated pip build)
REGISTRY_USERS = {"ensure_base_env", "shared_env_cache", "real_taskset", "_pip"}


def _network_marked(node: ast.AST) -> bool:
    return "network" in ast.unparse(node)


def test_tests_that_use_the_registry_are_marked_network() -> None:
    """A test that pip-installs is marked ``network`` (on itself or its module): it then skips with the
    reason where the registry is unreachable and stays out of ``make test-fast``."""
    bad = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        module_marks = [n for n in tree.body if isinstance(n, ast.Assign) and "pytestmark" in ast.unparse(n)]
        if any(_network_marked(m) for m in module_marks):
            continue
        for fn in tree.body:
            if not isinstance(fn, ast.FunctionDef) or not fn.name.startswith("test_"):
                continue
            used = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
            if used & REGISTRY_USERS and not any(_network_marked(d) for d in fn.decorator_list):
                bad.append(f"{path.relative_to(ROOT)}::{fn.name} uses {sorted(used & REGISTRY_USERS)}")
    assert not bad, "registry users not marked network:\n" + "\n".join(bad)
