"""Every name a benchmark script imports from cadenza exists: a move inside the package must not leave a
bench that fails at its first line (``bench/sandbox.py`` once imported a helper from its old module). The
scripts are read, not run: a benchmark takes minutes."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
SCRIPTS = sorted(BENCH.glob("*.py"))


def _cadenza_imports(path: Path) -> list[tuple[str, str | None, int]]:
    """(module, name or None, line) of every ``import cadenza...`` / ``from cadenza... import name``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("cadenza"):
            found += [(node.module, a.name, node.lineno) for a in node.names if a.name != "*"]
        elif isinstance(node, ast.Import):
            found += [(a.name, None, node.lineno) for a in node.names if a.name.startswith("cadenza")]
    return found


def test_the_scripts_are_found() -> None:
    assert len(SCRIPTS) >= 10 and sum(bool(_cadenza_imports(p)) for p in SCRIPTS) >= 8


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_every_cadenza_name_a_bench_imports_exists(script: Path) -> None:
    missing = []
    for module, name, line in _cadenza_imports(script):
        mod = importlib.import_module(module)
        if name is not None and not hasattr(mod, name):
            try:  # ``from package import submodule``
                importlib.import_module(f"{module}.{name}")
            except ModuleNotFoundError:
                missing.append(f"{script.name}:{line}: {module} has no {name}")
    assert not missing, missing
