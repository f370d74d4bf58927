"""A tiny built-in task (a calculator package with ``clamp`` removed) for smoke tests, benchmarks and demos.

It has the full task format of :mod:`cadenza.tasks.records.task`: ``task.json``, ``workspace/`` (the
package and its tests, the feature deleted) and ``gold.patch``; F2P tests cover ``clamp`` (plain,
parametrized and a class method), P2P tests cover the rest.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from cadenza.tasks.records.task import Feature, Task, save_task

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
    "tests/test_ops.py": """import pytest

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
""",
    "tests/test_text.py": "from calc.text import shout\n\n\ndef test_shout():\n    assert shout('hi') == "
    "'HI!'\n",
    "pyproject.toml": '[project]\nname = "calc"\nversion = "0.1"\n\n[tool.pytest.ini_options]\ntestpaths = '
    '["tests"]\n',
}
F2P = [
    "tests/test_ops.py::test_clamp_inside",
    "tests/test_ops.py::test_clamp_bounds[low]",
    "tests/test_ops.py::test_clamp_bounds[high]",
    "tests/test_ops.py::TestClamp::test_bad_interval",
]
P2P = ["tests/test_ops.py::test_add", "tests/test_ops.py::test_mul", "tests/test_text.py::test_shout"]
GOLD_PATCH = "".join(
    difflib.unified_diff(
        OPS_REMOVED.splitlines(keepends=True),
        OPS_SOLVED.splitlines(keepends=True),
        "a/calc/ops.py",
        "b/calc/ops.py",
    )
)


def make_task(taskset: Path, name: str, env: Path) -> Path:
    """Write the task ``taskset/name`` whose environment is ``env`` (a venv with pytest); return its
    directory."""
    task_dir = taskset / name
    for rel, text in FILES.items():
        path = task_dir / "workspace" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (task_dir / "gold.patch").write_text(GOLD_PATCH)
    task = Task(
        id=name,
        source="local:calc",
        level=1,
        statement="Implement `calc.ops.clamp(x, lo, hi)`: limit x to "
        "[lo, hi]; raise ValueError when lo > hi.",
        feature=Feature(qualname="calc.ops.clamp", path="calc/ops.py", kind="function"),
        fail_to_pass=list(F2P),
        pass_to_pass=list(P2P),
        package="calc",
        env=str(env),
        test_files=["tests/test_ops.py", "tests/test_text.py"],
        test_timeout_s=60,
    )
    save_task(task_dir, task)
    return task_dir
