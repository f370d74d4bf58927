"""Run pytest through an executor (the sandbox, or the host for trusted code) and return a TestReport.

Every run, whoever asks for it (baseline, validation, ``tasks verify``, grading), is the same command:
plugin autoloading off, only our plugin (:mod:`cadenza.testrun.plugin`) and the environment's own
installed plugins (found from its read-only site-packages, never from the workspace) loaded with
``-p``, no cache provider, the project's ``addopts`` cleared (callers pass the neutralised ones),
``--confcutdir`` at the workspace, and a clean environment without ``PYTHON*``/``PYTEST*`` variables
from the caller. Outcomes come only from the verified channel (:mod:`cadenza.testrun.channel`).
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from cadenza.pathrel import is_within
from cadenza.sandbox.execute import kill_tree
from cadenza.testrun.capabilities import visible_allowances
from cadenza.testrun.channel import LEGACY_PLUGIN_MODULE, Channel, Checks
from cadenza.testrun.report import TestReport

OUTPUT_TAIL = 4000


@dataclass(kw_only=True)
class Executed:
    exit_code: int
    timed_out: bool
    output: str


class CommandExecutor(Protocol):
    """Runs one command; ``channel`` must be writable by it (the sandbox binds it read-write)."""

    def execute(self, argv: list[str], *, env: dict[str, str], cwd: Path, timeout_s: float) -> Executed: ...


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The caller's environment without interpreter, pytest, coverage, venv and pip variables."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTHON", "PYTEST", "COV_", "COVERAGE", "VIRTUAL_ENV", "PIP_", "CADENZA_"))
    }
    env.update({"PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0", "PYTHONNOUSERSITE": "1"})
    env.update(extra or {})
    return env


class HostExecutor:
    """Runs on the host in its own process group, killed with it on timeout (trusted code only)."""

    def execute(self, argv: list[str], *, env: dict[str, str], cwd: Path, timeout_s: float) -> Executed:
        with tempfile.TemporaryFile() as log:
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=clean_env(env),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            timed_out = False
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                kill_tree(proc.pid)
                proc.wait()
            log.seek(max(0, log.seek(0, os.SEEK_END) - OUTPUT_TAIL))
            tail = log.read().decode(errors="replace")
        return Executed(exit_code=-9 if timed_out else proc.returncode, timed_out=timed_out, output=tail)


class SandboxExecutor:
    """Runs inside a :class:`cadenza.sandbox.Sandbox` (which must bind the channel read-write)."""

    def __init__(self, box, stop: Callable[[], str | None] | None = None) -> None:
        self.box, self.stop = box, stop  # stop: polled while the run goes; a reason kills it

    def execute(self, argv: list[str], *, env: dict[str, str], cwd: Path, timeout_s: float) -> Executed:
        full = {
            **env,
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONHASHSEED": "0",
            "PYTHONNOUSERSITE": "1",
        }
        res = self.box.run(argv, timeout_s=timeout_s, cwd=cwd, env=full, merge_stderr=True, stop=self.stop)
        return Executed(exit_code=res.exit_code, timed_out=res.timed_out, output=res.output[-OUTPUT_TAIL:])


def env_plugins(sys_path: list[str] | tuple[str, ...], exclude: list[Path]) -> list[str]:
    """Modules of the ``pytest11`` entry points installed in the environment's own directories.

    Directories inside ``exclude`` (the workspace and its pristine original) are skipped: packaging
    metadata written there is the agent's, and is never a source of plugins.
    """
    roots = [os.path.realpath(p) for p in exclude]
    path = [
        p for p in sys_path if os.path.isdir(p) and not any(is_within(os.path.realpath(p), r) for r in roots)
    ]
    mods: list[str] = []
    for dist in importlib.metadata.distributions(path=path):
        for ep in dist.entry_points:
            if ep.group == "pytest11" and ep.module not in mods:
                mods.append(ep.module)
    return mods


SKIP_DIRS = frozenset({".git", ".hg", ".venv", "venv", "node_modules", "__pycache__", ".tox", "build"})


def workspace_allowances(workspace: Path) -> dict[str, list[str]]:
    """The guard's per-file allowances for a workspace: each Python file may use what its source
    visibly uses (grading has refused, before this, any such use the pristine code never made)."""
    files: dict[str, bytes] = {}
    for dirpath, dirnames, filenames in os.walk(workspace):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.endswith("-packages")]
        for name in filenames:
            if name.endswith(".py"):
                path = Path(dirpath) / name
                try:
                    files[str(path.relative_to(workspace))] = path.read_bytes()
                except OSError:
                    continue
    return visible_allowances(files)


def pytest_command(
    python: str,
    workspace: Path,
    *,
    boot: Path,
    plugins: list[str],
    extra_args: list[str],
    files: list[str],
    per_test_timeout_s: float | None,
    coverage_rc: Path | None = None,
    clear_addopts: bool = True,
    by_path: bool = True,
) -> list[str]:
    """The one pytest command line (see module docstring): the interpreter on the runner's boot file,
    its config, then pytest's arguments."""
    args = ["-p", "no:cacheprovider"] + ([] if by_path else ["-p", LEGACY_PLUGIN_MODULE])
    for mod in plugins:
        args += ["-p", mod]
    args += [
        *(["-o", "addopts="] if clear_addopts else []),
        "-q",
        f"--confcutdir={workspace}",
        "--rootdir=.",
        "--continue-on-collection-errors",
    ]
    # --tb=no last so it wins: formatting hundreds of tracebacks (a deletion that breaks many tests)
    # costs ~15x the CPU of the run itself, and outcomes come from the plugin anyway.
    args += [*extra_args, "--tb=no"]
    if per_test_timeout_s and "pytest_timeout" in plugins:
        args.append(f"--timeout={per_test_timeout_s:g}")
    args += files
    head = [str(boot), str(boot.with_name("config.json"))]
    if coverage_rc is not None:
        return [python, "-m", "coverage", "run", f"--rcfile={coverage_rc}", *head, *args]
    return [python, *head, *args]


def run_tests(
    *,
    python: str | os.PathLike[str],
    workspace: Path,
    node_ids: list[str] | None,
    executor: CommandExecutor,
    channel_dir: Path,
    plugins: list[str],
    extra_args: list[str] | None = None,
    pythonpath: list[str] | None = None,
    timeout_s: float = 600.0,
    per_test_timeout_s: float | None = 60.0,
    coverage_rc: Path | None = None,
    checks: Checks | None = None,
    autoload_off: bool = True,
    clear_addopts: bool = True,
    test_paths: list[str] | None = None,
    allow: dict[str, list[str]] | None = None,
    reverse: bool = False,
) -> TestReport:
    """Run ``node_ids`` (``None``: the configured suite) in ``workspace`` and read the verified outcomes.

    ``channel_dir`` is an empty directory outside the workspace that the executor can write. IDs that
    never report are ``missing``; a run with tampering evidence passes nothing. ``test_paths``
    (workspace-relative) are the trusted test files beside the usual patterns; ``allow`` maps a
    workspace file to the capability kinds the guard lets it use (see :mod:`cadenza.testrun.guard`);
    ``reverse`` runs the selected tests in the opposite of their collection order.
    """
    workspace = Path(workspace).absolute()
    files: list[str] = []
    if node_ids is not None:
        files = sorted({n.split("::", 1)[0] for n in node_ids if (workspace / n.split("::", 1)[0]).exists()})
        if not files:
            return TestReport(
                outcomes={}, requested=list(node_ids), exit_code=4, timed_out=False, duration_s=0.0
            )
    checks = checks or Checks()
    if coverage_rc is not None and checks.guard:
        # coverage's tracer and the guard's hook deadlock a process that forks (toolz's Pool test):
        # a coverage run only maps tests to features, on the pristine source; no verdict comes from it
        checks = replace(checks, guard=False)
    if allow is None and checks.guard:
        allow = workspace_allowances(workspace)
    channel = Channel(
        channel_dir,
        select=node_ids,
        cov_context=coverage_rc is not None,
        checks=checks,
        test_paths=test_paths,
        allow=allow,
        reverse=reverse,
        plugins=plugins,
    )
    argv = pytest_command(
        str(python),
        workspace,
        boot=channel.boot,
        plugins=plugins,
        extra_args=list(extra_args or []),
        files=files,
        per_test_timeout_s=per_test_timeout_s,
        coverage_rc=coverage_rc,
        clear_addopts=clear_addopts,
        by_path=checks.by_path,
    )
    env = {"PYTHONPATH": os.pathsep.join(pythonpath or [])} if pythonpath else {}
    if autoload_off:
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    start = time.monotonic()
    done = executor.execute(argv, env=env, cwd=workspace, timeout_s=timeout_s)
    duration = time.monotonic() - start
    got = channel.read(exit_code=None if done.timed_out else done.exit_code)
    return TestReport(
        outcomes=got.outcomes,
        requested=list(node_ids) if node_ids is not None else None,
        exit_code=done.exit_code,
        timed_out=done.timed_out,
        duration_s=duration,
        collect_errors=got.collect_errors,
        output_tail=done.output,
        tampering=got.tampering,
        complete=got.complete,
        cpu_s=got.cpu_s,
    )
