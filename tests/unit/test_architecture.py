"""Layering rules, enforced: the task factory, sandbox, agent, monitor and feedback import no torch (they
install and run without ``cadenza[train]``); ``optim`` and ``parallel`` know nothing of tasks or agents.

Two checks: the source (AST, lazy imports inside functions included: no torch-side package at any depth;
numpy/matplotlib only lazily, for plots) and the runtime (every module imports with the ``train``
packages blocked; the CLI command modules too, whose command bodies load training code on demand)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from tests.support.imports import circles, import_graph
from tests.support.torchless import run_torchless

CADENZA = Path(__file__).resolve().parents[2] / "cadenza"
TORCH_FREE = ("tasks", "sandbox", "agent", "monitor", "feedback", "integrations")
TORCH_SIDE = ("torch", "transformers", "tokenizers", "safetensors")
TORCH_FREE_MODULES = ("cli", "errors", "jsonio", "config_io", "preflight", "installer")
TRAINING_SIDE = ("rl", "optim", "parallel", "pretrain", "experiments")
AGENT_SIDE = ("tasks", "sandbox", "agent", "monitor", "feedback", "rl", "pretrain", "experiments", "commands")

#: The house from the ground up: a module may import its own unit and units on lower floors only (units on
#: one floor know nothing of each other). A unit is the longest listed prefix of a module's name; a module
#: no unit names fails the test, so a new package has to be given its floor. Inside ``rl`` the floors
#: follow the data: text and models, engines, config, then rollout and learn side by side (a token
#: trajectory is their contract), then train composing them. In ``tasks``: records (task, store, pool) and
#: sources (fetch, isolation, runner, venvs), then deletion and leaks side by side, validation, the builder.
#: ``agent.trajectory`` and ``agent.llm`` are the formats the monitor reads, below the monitor that the
#: agent's episode runs.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "jsonio", "lazy", "pathrel", "installer"),
    ("", "config_io", "metrics", "checkpoint", "scale", "testing"),
    ("optim", "parallel", "sandbox", "executor"),
    ("testrun", "preflight"),
    ("tasks.records", "tasks.sources", "agent.trajectory", "agent.llm"),
    ("tasks.deletion", "tasks.leaks"),
    ("tasks.validation",),
    ("tasks.builder", "tasks"),
    ("agent.grading",),
    ("monitor",),
    ("agent",),
    ("feedback", "integrations"),
    ("pretrain", "rl.text", "rl.models"),
    ("rl.engines",),
    ("rl.config",),
    ("rl.rollout", "rl.learn"),
    ("rl.train", "rl"),
    ("experiments",),
    ("docgen", "commands", "cli"),
    ("__main__",),
)


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


@functools.cache
def _graph() -> dict[str, dict[str, int]]:
    return import_graph(CADENZA.parent)


def _unit(module: str) -> str:
    rest = module.removeprefix("cadenza").removeprefix(".")
    units = [u for floor in LAYERS for u in floor if rest == u or rest.startswith(u + ".") or u == ""]
    return max(units, key=len)


def test_no_import_circle() -> None:
    """No set of cadenza modules imports each other round (lazy imports in functions included, package
    ``__init__`` modules too): a circle means two modules are one job, or a third owns what both need."""
    found = circles(_graph())
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_upward_import() -> None:
    """Every import (lazy ones too) points to the module's own unit or a lower floor of :data:`LAYERS`."""
    floor = {u: i for i, units in enumerate(LAYERS) for u in units}
    bad = []
    for module, edges in _graph().items():
        src = _unit(module)
        for target, line in edges.items():
            dst = _unit(target)
            if dst != src and floor[dst] >= floor[src]:
                bad.append(f"{module}:{line} ({src or 'cadenza'}) imports {target} ({dst or 'cadenza'})")
    assert not bad, "imports that do not point down:\n" + "\n".join(bad)


def test_every_module_has_a_floor_and_rl_is_split() -> None:
    """The unit of every module is a listed one (not just the catch-all root), and rl's own modules live
    in its sub-packages (only ``models`` at its top, beside the ``config`` package)."""
    modules = _graph()
    loose = [m for m in modules if m != "cadenza" and _unit(m) == ""]
    assert not loose, f"modules outside every listed unit (add them to LAYERS): {loose}"
    top = sorted(p.stem for p in (CADENZA / "rl").glob("*.py"))
    assert top == ["__init__", "models"], top
    assert [p.stem for p in (CADENZA / "tasks").glob("*.py")] == ["__init__"]


def test_no_folder_over_15_modules() -> None:
    """A folder a newcomer can take in at a glance: at most 15 modules besides its ``__init__``."""
    crowded = {
        str(d.relative_to(CADENZA.parent)): n
        for d in [CADENZA, *(p for p in CADENZA.rglob("*") if p.is_dir() and p.name != "__pycache__")]
        if (n := len([f for f in d.glob("*.py") if f.name != "__init__.py"])) > 15
    }
    assert not crowded, f"folders over 15 modules (split them into sub-packages): {crowded}"


def test_no_module_over_400_lines() -> None:
    """A module a maintainer can read in one sitting: at most 400 lines (split it by job when it grows)."""
    long = {
        str(f.relative_to(CADENZA.parent)): n
        for f in CADENZA.rglob("*.py")
        if (n := len(f.read_text().splitlines())) > 400
    }
    assert not long, f"modules over 400 lines: {long}"
