"""A tiny synthetic project for task-factory tests (flat or src layout), written into a tmp dir."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

INIT = '''\
"""Mini library."""
from .core import add, mul, Stack
from . import textutil

__all__ = ["add", "mul", "Stack", "textutil"]
'''

CORE = '''\
"""Core arithmetic."""

# A comment that must survive.
def add(a, b):
    """Return the sum of a and b."""
    total = a + b  # inline comment about totals
    return total


def mul(a, b):
    """Multiply two numbers by repeated addition."""
    result = 0
    for _ in range(b):
        result = add(result, a)
    return result


plus = add


class Stack:
    """A LIFO stack."""

    def __init__(self):
        self._items = []

    def push(self, item):
        """Push an item and return the new size."""
        self._items.append(item)
        return len(self._items)

    def pop(self):
        """Pop the top item."""
        if not self._items:
            raise IndexError("pop from empty stack")
        return self._items.pop()

    def peek(self):
        return self._items[-1]

    top = peek
'''

TEXTUTIL = '''\
"""Text helpers."""


def shout(text):
    """Upper-case text with an exclamation mark."""
    return text.upper() + "!!"


def whisper(text):
    return text.lower() + "..."
'''

TEST_CORE = """\
from minilib import add, mul, Stack
from minilib.core import plus


def test_add():
    assert add(2, 3) == 5


def test_plus():
    assert plus(1, 1) == 2


def test_mul():
    assert mul(3, 4) == 12


def test_stack_push_pop():
    s = Stack()
    assert s.push(1) == 1
    assert s.push(2) == 2
    assert s.pop() == 2


def test_stack_peek():
    s = Stack()
    s.push(7)
    assert s.peek() == 7 and s.top() == 7
"""

TEST_TEXT = """\
import minilib


def test_shout():
    assert minilib.textutil.shout("hi") == "HI!!"


def test_whisper():
    from minilib.textutil import whisper
    assert whisper("HI") == "hi..."
"""


def make_repo(
    root: Path,
    *,
    layout: str = "flat",
    extra_tests: dict[str, str] | None = None,
    pyproject: str | None = None,
) -> Path:
    """Write the mini project under ``root`` and return ``root``."""
    pkg = root / ("src/minilib" if layout == "src" else "minilib")
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(INIT)
    (pkg / "core.py").write_text(CORE)
    (pkg / "textutil.py").write_text(TEXTUTIL)
    tests = root / "tests"
    tests.mkdir()
    (tests / "test_core.py").write_text(TEST_CORE)
    (tests / "test_text.py").write_text(TEST_TEXT)
    for name, text in (extra_tests or {}).items():
        (tests / name).write_text(textwrap.dedent(text))
    (root / "pyproject.toml").write_text(
        pyproject
        or textwrap.dedent("""\
        [project]
        name = "minilib"
        version = "0.3.1"
        dependencies = []

        [tool.pytest.ini_options]
        addopts = "--cov=minilib --cov-report=term -p pytest_cov"
        """)
    )
    return root


def shared_env_cache(tmp_path_factory) -> Path:
    """One base-env cache for the whole test run (or ``CADENZA_TEST_ENV_CACHE`` to keep it across
    runs)."""
    import os

    from tests.support.run_cache import run_dir

    keep = os.environ.get("CADENZA_TEST_ENV_CACHE")
    if keep:
        return Path(keep)
    return run_dir(tmp_path_factory) / "cadenza-env-cache"  # shared by the xdist workers (it locks per env)


def bad_sources(root: Path) -> dict[str, str]:
    """Bad sources (missing, no tests, not Python, a dependency that does not exist) -> a word their report
    row must contain."""
    no_tests = root / "no-tests"
    (no_tests / "pkg").mkdir(parents=True)
    (no_tests / "pkg" / "__init__.py").write_text("def f():\n    return 1\n")
    not_python = root / "not-python"
    not_python.mkdir()
    (not_python / "index.js").write_text("module.exports = () => 1;\n")
    (not_python / "README.md").write_text("# a JavaScript project\n")
    broken = make_repo(
        root / "broken-install",
        pyproject=textwrap.dedent("""\
        [project]
        name = "minilib"
        version = "1"
        dependencies = ["cadenza-no-such-dependency-xyz==0.0.1"]
        """),
    )
    return {
        str(root / "does-not-exist"): "exist",
        str(no_tests): "test",
        str(not_python): "python",
        str(broken): "cadenza-no-such-dependency-xyz",
    }


#: Three real PyPI packages of three layouts (src, tests inside the package, flat with a test dependency).
REAL_SOURCES = ["pypi:cachetools==8.0.2", "pypi:toolz==1.2.0", "pypi:tinydb==4.9.0"]


def real_taskset(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess, dict[str, str]]:
    """``cadenza tasks build`` of :data:`REAL_SOURCES` and :func:`bad_sources` in one call (2 workers, one
    task per source, levels 1-2, seed 3), built once per test run for every worker that asks: the task
    set, the build's completed process and the bad sources."""
    import json
    import os
    import sys

    from tests.support.run_cache import build_once

    def build(d: Path) -> None:
        bad = bad_sources(d / "bad")
        # COLUMNS: the summary table keeps its columns with the longer tmp paths of an xdist worker
        env = {**os.environ, "CADENZA_ENV_CACHE": str(shared_env_cache(tmp_path_factory)), "COLUMNS": "240"}
        build_cli = [sys.executable, "-m", "cadenza", "tasks", "build"]
        cmd = [*build_cli, *REAL_SOURCES, *bad, "--out", str(d / "set")]
        cmd += ["--workers", "2", "--max-tasks", "1", "--levels", "1,2", "--seed", "3", "--quiet"]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=1500, env=env)
        run = {"args": cmd, "returncode": res.returncode, "stdout": res.stdout, "stderr": res.stderr}
        (d / "build.json").write_text(json.dumps({"run": run, "bad": bad}))

    d = build_once(tmp_path_factory, "real-taskset", build)
    rec = json.loads((d / "build.json").read_text())
    return d / "set", subprocess.CompletedProcess(**rec["run"]), rec["bad"]
