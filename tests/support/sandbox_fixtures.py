"""Fixtures for the sandbox/agent tests: the built-in toy task in a task set, with a real venv.

The task environment, ``task_env``, is ``tests/support/monitor_fixtures.py``'s (one fast build per
session); ``tests/integration/conftest.py`` registers both modules' fixtures.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cadenza.agent.toytask import F2P, FILES, GOLD_PATCH, OPS_REMOVED, OPS_SOLVED, P2P, make_task

__all__ = [
    "F2P",
    "FILES",
    "GOLD_PATCH",
    "OPS_REMOVED",
    "OPS_SOLVED",
    "P2P",
    "make_task",
    "require_protection",
    "task_dir",
    "taskset",
]


def require_protection(available: bool, what: str) -> None:
    """Guard for a protection the product promises (a process cap, a cgroup): never assert nothing.

    Without it the test fails under CI (``CI`` set) and ``make test`` (``CADENZA_REQUIRE_ENGINES=1``), so
    neither can silently lose it; elsewhere it skips with a visible reason.
    """
    import os

    from tests.support.lanes import engines_required

    if available:
        return
    if os.environ.get("CI") or engines_required():  # CI, and make test on any machine
        pytest.fail(f"{what} is unavailable on this CI machine, but the sandbox promises it")
    pytest.skip(f"{what} is unavailable here (CI fails instead of skipping)")


@pytest.fixture
def taskset(tmp_path: Path, task_env: Path) -> Path:
    """A task set with two tasks (``calc-clamp`` and ``calc-other``)."""
    root = tmp_path / "taskset"
    make_task(root, "calc-clamp", task_env)
    make_task(root, "calc-other", task_env)
    return root


@pytest.fixture
def task_dir(taskset: Path) -> Path:
    return taskset / "calc-clamp"


@pytest.fixture
def chained_task_dir(taskset: Path, task_env: Path) -> Path:
    """A task laid out like the task factory's: ``env/`` inside the task directory, a venv without the
    package whose ``.pth`` puts the task's ``workspace/`` on ``sys.path`` (relative path) and chains a
    shared deps-only base env (here ``task_env``) with ``site.addsitedir``."""
    import json
    import os

    task_dir = make_task(taskset, "calc-chained", task_env)
    data = json.loads((task_dir / "task.json").read_text())
    data["env"] = "env"
    (task_dir / "task.json").write_text(json.dumps(data))
    env = task_dir / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    site = next(env.glob("lib/python*/site-packages"))
    base_site = next(task_env.glob("lib/python*/site-packages")).resolve()
    rel = os.path.relpath((task_dir / "workspace").resolve(), site.resolve())
    (site / "cadenza_task.pth").write_text(f"{rel}\nimport site; site.addsitedir({str(base_site)!r})\n")
    return task_dir
