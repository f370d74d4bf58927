"""A tiny real task for the sandbox/agent tests: a pure-Python package with tests, one feature removed.

``task_env`` is a real venv with pytest, built once per session. ``make_task`` writes the task
directory format of ``cadenza.tasks.task`` (task.json, workspace/, gold.patch) into a task set.
"""

from __future__ import annotations

import difflib
import subprocess
import sys
from pathlib import Path

import pytest

from cadenza.tasks.task import Feature, Task, save_task

OPS_SOLVED = '''"""Arithmetic helpers."""


def add(a, b):
    return a + b


def mul(a, b):
    return a * b


def clamp(x, lo, hi):
    """Limit x to the closed interval [lo, hi]."""
    if lo > hi:
        raise ValueError("lo must not exceed hi")
    return max(lo, min(x, hi))
'''
OPS_REMOVED = OPS_SOLVED[: OPS_SOLVED.index("\n\ndef clamp")] + "\n"

FILES = {
    "calc/__init__.py": '"""A tiny calculator."""\n',
    "calc/ops.py": OPS_REMOVED,
    "calc/text.py": 'def shout(s):\n    return s.upper() + "!"\n',
    "tests/test_ops.py": '''import pytest

from calc import ops


def test_add():
    assert ops.add(2, 3) == 5


def test_mul():
    assert ops.mul(4, 5) == 20


def test_clamp_inside():
    assert ops.clamp(5, 0, 10) == 5


@pytest.mark.parametrize("x,expected", [(-3, 0), (42, 10)], ids=["low", "high"])
def test_clamp_bounds(x, expected):
    assert ops.clamp(x, 0, 10) == expected


class TestClamp:
    def test_bad_interval(self):
        with pytest.raises(ValueError):
            ops.clamp(1, 5, 0)
''',
    "tests/test_text.py": "from calc.text import shout\n\n\ndef test_shout():\n    assert shout('hi') == 'HI!'\n",
    "pyproject.toml": '[project]\nname = "calc"\nversion = "0.1"\n\n[tool.pytest.ini_options]\ntestpaths = ["tests"]\n',
}
F2P = [
    "tests/test_ops.py::test_clamp_inside",
    "tests/test_ops.py::test_clamp_bounds[low]",
    "tests/test_ops.py::test_clamp_bounds[high]",
    "tests/test_ops.py::TestClamp::test_bad_interval",
]
P2P = ["tests/test_ops.py::test_add", "tests/test_ops.py::test_mul", "tests/test_text.py::test_shout"]
GOLD_PATCH = "".join(difflib.unified_diff(
    OPS_REMOVED.splitlines(keepends=True), OPS_SOLVED.splitlines(keepends=True), "a/calc/ops.py", "b/calc/ops.py"))


def make_task(taskset: Path, name: str, env: Path) -> Path:
    task_dir = taskset / name
    for rel, text in FILES.items():
        path = task_dir / "workspace" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (task_dir / "gold.patch").write_text(GOLD_PATCH)
    task = Task(
        id=name, source="local:calc", level=1, statement="Implement `calc.ops.clamp(x, lo, hi)`: limit x to "
        "[lo, hi]; raise ValueError when lo > hi.",
        feature=Feature(qualname="calc.ops.clamp", path="calc/ops.py", kind="function"),
        fail_to_pass=list(F2P), pass_to_pass=list(P2P), package="calc", env=str(env),
        test_files=["tests/test_ops.py", "tests/test_text.py"], test_timeout_s=60,
    )
    save_task(task_dir, task)
    return task_dir


@pytest.fixture(scope="session")
def task_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real venv with pytest (the task environment), built once per test session."""
    env = tmp_path_factory.mktemp("task-env") / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"), "install", "-q",
                    "--disable-pip-version-check", "pytest"], check=True, timeout=600)
    return env


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
