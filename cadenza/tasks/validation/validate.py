"""Validation of one deletion: imports, FAIL_TO_PASS / PASS_TO_PASS, and the gold patch.

Order (cheapest rejection first):

1. the package's modules that imported at baseline still import;
2. optionally (``probe=True``) the tests covering the feature run with ``-x``; if none fails,
   reject. Off by default: deletions of covered code nearly always break a covering test, so the
   probe mostly costs one more pytest start per task;
3. the whole suite runs: F2P = baseline-passing tests that now fail/error/go missing,
   P2P = baseline-passing tests that still pass; both must be non-empty;
4. the gold patch is applied with ``git apply`` in a fresh post-deletion copy (pristine + deletion);
   the restored files must equal the originals byte for byte and the F2P tests must pass there
   (``gold_check="full"`` reruns F2P + P2P instead: P2P already passed twice on that identical
   tree in the baseline, so by default it is not paid for again).
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from cadenza.sandbox import SandboxConfig
from cadenza.tasks.deletion.baseline import Baseline
from cadenza.tasks.deletion.delete import Deletion, apply_deletion, resolve_import
from cadenza.tasks.sources.deps import parsed_files
from cadenza.tasks.sources.runner import RunCounter, run_pytest, run_python
from cadenza.tasks.sources.source import copy_tree
from cadenza.tasks.sources.venv import BaseEnv, make_task_env
from cadenza.testrun import TestReport, env_plugins

GoldCheck = Literal["f2p", "full"]


@dataclass(kw_only=True)
class Validation:
    ok: bool
    reason: str = ""
    fail_to_pass: list[str] = field(default_factory=list)
    pass_to_pass: list[str] = field(default_factory=list)


@dataclass(kw_only=True)
class ValidationSettings:
    """How a candidate is tested (one set of defaults: :class:`cadenza.tasks.builder.pipeline.SourceConfig`
    extends it)."""

    timeout_s: float = 600.0  # a whole-suite run is killed with its process group after this
    per_test_timeout_s: float | None = 30.0  # per-test limit (None: none)
    gold_check: GoldCheck = "f2p"  # "full": the gold copy reruns P2P too (see the module docstring)
    probe: bool = False  # first run the covering tests with -x and reject when none fails


@dataclass(kw_only=True)
class ValidationContext:
    """Everything shared by all candidates of one source."""

    base_env: BaseEnv
    pristine: Path
    baseline: Baseline
    pytest_args: list[str]
    importable: list[str]
    test_paths: list[str] = field(default_factory=list)
    settings: ValidationSettings = field(default_factory=ValidationSettings)
    counter: RunCounter | None = None
    #: validation runs third-party test suites: inside bubblewrap (None: on the host, trusted code only)
    sandbox: SandboxConfig | None = field(default_factory=lambda: SandboxConfig(timeout_s=600.0))


def importable_modules(
    python: Path, workspace: Path, modules: list[str], timeout_s: float = 300.0
) -> list[str]:
    """The subset of ``modules`` that import cleanly (each tried in one interpreter)."""
    code = (
        "import importlib, json, sys\nok = []\n"
        f"for m in {modules!r}:\n"
        "    try:\n        importlib.import_module(m)\n        ok.append(m)\n"
        "    except BaseException:\n        pass\n"
        "print(json.dumps(ok))\n"
    )
    proc = run_python(python, code, cwd=workspace, timeout_s=timeout_s)
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return []


def import_error(python: Path, workspace: Path, modules: list[str], timeout_s: float = 120.0) -> str | None:
    """None if every module imports, else a one-line reason."""
    code = "import importlib\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules)
    proc = run_python(python, code, cwd=workspace, timeout_s=timeout_s)
    if proc.returncode == 0:
        return None
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    return lines[-1][:200] if lines else f"exit {proc.returncode}"


def _module_name(rel: str, import_root: str) -> tuple[str, bool]:
    """Dotted name of a root-relative ``.py`` path (for resolving relative imports in test files)."""
    path = Path(rel)
    if import_root != "." and path.parts[0] == import_root:
        path = Path(*path.parts[1:])
    parts = list(path.with_suffix("").parts)
    is_pkg = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_pkg else parts), is_pkg


def broken_test_files(deletion: Deletion, root: Path, test_paths: list[str], import_root: str) -> set[str]:
    """Test files whose module-level imports name something the deletion removed (they fail to collect)."""
    gone = {m: set(names) for m, names in deletion.removed_names.items()}
    dead = deletion.candidate.module if deletion.candidate.kind == "module" else None

    def is_dead(mod: str) -> bool:
        return bool(dead) and (mod == dead or mod.startswith(f"{dead}."))

    broken: set[str] = set()
    for rel, tree in parsed_files(root, test_paths):
        module, is_pkg = _module_name(rel, import_root)
        for node in tree.body:
            if isinstance(node, ast.ImportFrom):
                mod = resolve_import(module, is_pkg, node.level, node.module)
                names = {a.name for a in node.names}
                if is_dead(mod) or names & gone.get(mod, set()) or any(is_dead(f"{mod}.{n}") for n in names):
                    broken.add(rel)
            elif isinstance(node, ast.Import) and any(is_dead(a.name) for a in node.names):
                broken.add(rel)
    return broken


def _under_broken(test_file: str, broken: set[str]) -> bool:
    """A test fails to collect if its file, or a conftest.py in one of its directories, does."""
    if test_file in broken:
        return True
    parts = Path(test_file).parts[:-1]
    return any("/".join((*parts[:i], "conftest.py")) in broken for i in range(len(parts) + 1))


def _apply_patch(workspace: Path, patch: str) -> str | None:
    with tempfile.NamedTemporaryFile("w", suffix=".patch", delete=False) as fh:
        fh.write(patch)
        name = fh.name
    # Never let git discover an enclosing repository (e.g. a task set built inside a checkout): inside
    # one, ``git apply`` takes paths relative to *that* repository and silently skips the rest.
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(Path(workspace).resolve().parent)}
    try:
        proc = subprocess.run(
            ["git", "apply", "--whitespace=nowarn", name],
            cwd=workspace,
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
    finally:
        Path(name).unlink()
    return None if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["git apply failed"])[0]


def prepare_workspace(ctx: ValidationContext, deletion: Deletion, workspace: Path) -> None:
    """A fresh copy of the pristine tree with the deletion applied."""
    copy_tree(ctx.pristine, workspace)
    apply_deletion(workspace, deletion)


def validate(ctx: ValidationContext, deletion: Deletion, workspace: Path, scratch: Path) -> Validation:
    """Validate ``deletion`` already applied in ``workspace``; ``scratch`` is an empty dir for envs and
    copies."""
    passing = set(ctx.baseline.passing)
    covering = sorted(deletion.candidate.tests & passing)
    if not covering:
        return Validation(ok=False, reason="no passing test covers it")
    broken = broken_test_files(deletion, ctx.pristine, ctx.test_paths, ctx.base_env.import_root)
    if {t for t in passing if _under_broken(t.split("::", 1)[0], broken)} | set(covering) >= passing:
        return Validation(
            ok=False, reason="no test still passes after deletion (predicted from test imports)"
        )
    scratch.mkdir(parents=True, exist_ok=True)
    python = make_task_env(ctx.base_env, workspace, scratch / "env")
    deleted_module = deletion.candidate.module if deletion.candidate.kind == "module" else None
    mods = [
        m
        for m in ctx.importable
        if not deleted_module or not (m == deleted_module or m.startswith(deleted_module + "."))
    ]
    err = import_error(python, workspace, mods)
    if err:
        return Validation(ok=False, reason=f"import broken: {err}")
    kw = dict(
        timeout_s=ctx.settings.timeout_s,
        per_test_timeout_s=ctx.settings.per_test_timeout_s,
        extra_args=ctx.pytest_args,
        counter=ctx.counter,
        # a candidate env only adds the workspace to the base env: the same plugins, found without a probe
        plugins=env_plugins([str(ctx.base_env.site_packages)], [workspace]),
        sandbox=ctx.sandbox,
        bind_env=ctx.base_env.root,
    )
    if ctx.settings.probe and len(covering) * 2 <= len(passing):
        # Cheap rejection first: stop at the first failing covering test (-x).
        probe = run_pytest(python, workspace, covering, **{**kw, "extra_args": [*ctx.pytest_args, "-x"]})
        if not probe.not_passing:
            return Validation(ok=False, reason="no covering test fails")
    full = run_pytest(python, workspace, None, **kw)
    if full.timed_out:
        return Validation(ok=False, reason=f"suite timed out after deletion (>{ctx.settings.timeout_s:g}s)")
    f2p = sorted(t for t in passing if full.outcome(t) != "passed")
    p2p = sorted(t for t in passing if full.outcome(t) == "passed")
    if not f2p:
        return Validation(ok=False, reason="no test fails after deletion")
    if not p2p:
        return Validation(ok=False, reason="no test still passes after deletion")
    gold = scratch / "gold"
    prepare_workspace(ctx, deletion, gold)  # fresh: nothing the runs above wrote is carried over
    err = _apply_patch(gold, deletion.gold_patch)
    if err:
        return Validation(ok=False, reason=f"gold patch does not apply: {err}")
    for rel, text in deletion.original.items():
        if not (gold / rel).is_file() or (gold / rel).read_text() != text:
            return Validation(ok=False, reason=f"gold patch does not restore {rel}")
    gold_python = make_task_env(ctx.base_env, gold, scratch / "gold-env")
    check = f2p if ctx.settings.gold_check == "f2p" else f2p + p2p
    report = run_pytest(gold_python, gold, check, **kw)
    bad = [t for t in check if report.outcome(t) != "passed"]
    shutil.rmtree(gold, ignore_errors=True)
    if bad:
        return Validation(ok=False, reason=f"gold patch leaves {len(bad)} test(s) failing, e.g. {bad[0]}")
    return Validation(ok=True, fail_to_pass=f2p, pass_to_pass=p2p)


def recheck(
    *,
    workspace: Path,
    gold_patch: str,
    fail_to_pass: list[str],
    pass_to_pass: list[str],
    make_python: Callable[[Path, Path], Path],
    scratch: Path,
    pytest_args: list[str],
    timeout_s: float = 600.0,
    per_test_timeout_s: float | None = 60.0,
    counter: RunCounter | None = None,
    sandbox: SandboxConfig | None = None,
) -> Validation:
    """Re-validate an emitted task in clean copies (for ``verify``): never touches ``workspace``.

    With ``sandbox`` the test runs execute in bubblewrap (see
    :func:`cadenza.tasks.sources.runner.run_pytest`).

    On a copy of the workspace every F2P test must not pass and every P2P test must pass; on a
    second copy with ``gold_patch`` applied (``git apply``) all of them must pass.
    ``make_python(workspace_copy, env_dir)`` builds the env, e.g. ``lambda w, e: make_task_env(base, w, e)``.
    """
    scratch.mkdir(parents=True, exist_ok=True)
    tests = fail_to_pass + pass_to_pass

    def run(copy: Path) -> TestReport:
        return run_pytest(
            make_python(copy, copy.with_name(f"{copy.name}-env")),
            copy,
            tests,
            timeout_s=timeout_s,
            per_test_timeout_s=per_test_timeout_s,
            extra_args=pytest_args,
            counter=counter,
            sandbox=sandbox,
        )

    broken = scratch / "broken"
    shutil.copytree(workspace, broken, symlinks=True)
    report = run(broken)
    still = [t for t in fail_to_pass if report.passed(t)]
    if still:
        return Validation(
            ok=False, reason=f"{len(still)} FAIL_TO_PASS test(s) pass without the fix, e.g. {still[0]}"
        )
    lost = [t for t in pass_to_pass if not report.passed(t)]
    if lost:
        return Validation(
            ok=False, reason=f"{len(lost)} PASS_TO_PASS test(s) fail before the fix, e.g. {lost[0]}"
        )
    gold = scratch / "gold"
    shutil.copytree(workspace, gold, symlinks=True)
    err = _apply_patch(gold, gold_patch)
    if err:
        return Validation(ok=False, reason=f"gold patch does not apply: {err}")
    report = run(gold)
    bad = [t for t in tests if not report.passed(t)]
    if bad:
        return Validation(ok=False, reason=f"gold patch leaves {len(bad)} test(s) failing, e.g. {bad[0]}")
    return Validation(ok=True, fail_to_pass=list(fail_to_pass), pass_to_pass=list(pass_to_pass))
