"""Layering rules, enforced: the task factory, sandbox, agent, monitor and feedback import no torch (they
install and run without ``cadenza[train]``); ``optim`` and ``parallel`` know nothing of tasks or agents.

Two checks: the source (AST, lazy imports inside functions included: no torch-side package at any depth;
numpy/matplotlib only lazily, for plots) and the runtime (every module imports with the ``train``
packages blocked; the CLI command modules too, whose command bodies load training code on demand)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.torchless import run_torchless

CADENZA = Path(__file__).resolve().parents[2] / "cadenza"
TORCH_FREE = ("tasks", "sandbox", "agent", "monitor", "feedback", "integrations")
TORCH_SIDE = ("torch", "transformers", "tokenizers", "safetensors")
TORCH_FREE_MODULES = ("cli", "errors", "jsonio", "config_io", "preflight")
TRAINING_SIDE = ("rl", "optim", "parallel", "pretrain", "experiments")
AGENT_SIDE = ("tasks", "sandbox", "agent", "monitor", "feedback", "rl", "pretrain", "experiments", "commands")


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports, at any depth (a lazy import inside a function counts too)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
    return out


def _violations(packages: tuple[str, ...], banned) -> list[str]:
    files = [f for p in packages for f in sorted((CADENZA / p).rglob("*.py"))]
    return [
        f"{f.relative_to(CADENZA.parent)}:{line} imports {mod}"
        for f in files
        for line, mod in _imports(f)
        if banned(mod)
    ]


def test_torch_free_packages_import_no_torch_nor_training_code() -> None:
    def banned(mod: str) -> bool:
        parts = mod.split(".")
        return parts[0] in TORCH_SIDE or (
            parts[0] == "cadenza" and len(parts) > 1 and parts[1] in TRAINING_SIDE
        )

    found = _violations(TORCH_FREE, banned)
    found += [
        v
        for name in TORCH_FREE_MODULES
        for line, mod in _imports(CADENZA / f"{name}.py")
        if banned(mod) and (v := f"cadenza/{name}.py:{line} imports {mod}")
    ]
    assert not found, "torch-free code imports training code:\n" + "\n".join(found)


def test_optim_and_parallel_know_nothing_of_tasks_or_agents() -> None:
    def banned(mod: str) -> bool:
        parts = mod.split(".")
        return parts[0] == "cadenza" and len(parts) > 1 and parts[1] in AGENT_SIDE

    found = _violations(("optim", "parallel"), banned)
    assert not found, "optim/parallel import agent-side code:\n" + "\n".join(found)


def test_every_torch_free_module_imports_with_torch_blocked() -> None:
    code = f"""
import importlib, pkgutil
import cadenza
names = [f"cadenza.{{m}}" for m in {TORCH_FREE_MODULES!r}]
for pkg in {(*TORCH_FREE, "commands")!r}:
    mod = importlib.import_module(f"cadenza.{{pkg}}")
    names += [m.name for m in pkgutil.walk_packages(mod.__path__, f"cadenza.{{pkg}}.")]
for name in names:
    importlib.import_module(name)
print(len(names))
"""
    proc = run_torchless(code, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(proc.stdout.split()[-1]) > 60  # the packages were really walked


def test_the_blocker_blocks() -> None:
    proc = run_torchless("import torch", timeout=60)
    assert proc.returncode != 0 and "blocked: cadenza[train] not installed" in proc.stderr


def test_no_test_module_imports_another() -> None:
    """Shared test code lives in ``tests/support`` (or a conftest): a test module that imports another
    runs that module's tests' imports and fixtures twice and breaks when files move."""
    tests = CADENZA.parent / "tests"
    bad = [
        f"{path.relative_to(tests.parent)}:{line} imports {mod}"
        for path in tests.rglob("*.py")
        for line, mod in _imports(path)
        if mod.startswith("tests.") and not mod.startswith("tests.support")
    ]
    assert not bad, bad
