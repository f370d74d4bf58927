"""The task factory's side of the test runner: neutralised ``addopts`` and host runs of trusted code.

Every pytest run goes through :func:`cadenza.testrun.run_tests` (one plugin, one verified channel,
one :class:`~cadenza.testrun.TestReport`), the same runner grading uses inside the sandbox, so the
factory's F2P/P2P labels and the grader's verdict come from the same rules. This module adds the
factory's pieces: which project ``addopts`` are safe to keep and a run counter for the benchmark.
"""

from __future__ import annotations

import configparser
import re
import shlex
import tempfile
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from cadenza.sandbox import Sandbox, SandboxConfig
from cadenza.sandbox.envinfo import env_info
from cadenza.tasks.sources.isolate import SANDBOX_CPU, run_python
from cadenza.testrun import HostExecutor, SandboxExecutor, TestReport, env_plugins, run_tests

__all__ = [
    "COUNTER",
    "RunCounter",
    "TestReport",
    "pytest_args_for",
    "run_pytest",
    "run_python",
    "safe_addopts",
]

#: addopts that need no plugin and keep the suite's meaning; everything else is dropped.
SAFE_ADDOPTS_WITH_VALUE = {
    "--doctest-glob",
    "--import-mode",
    "--ignore",
    "--ignore-glob",
    "--deselect",
    "-W",
    "--pythonwarnings",
    "--confcutdir",
    "--doctest-report",
}
SAFE_ADDOPTS_FLAGS = {"--doctest-modules", "--doctest-continue-on-failure", "--strict-markers", "--strict"}


@dataclass
class RunCounter:
    """Counts pytest invocations: full-suite runs and tests executed in subset runs (for the benchmark)."""

    full_runs: int = 0
    subset_runs: int = 0
    subset_tests: int = 0
    seconds: float = 0.0
    sandbox_cpu_s: float = (
        0.0  # CPU of sandboxed runs: invisible to the host's rusage, reported by the plugin
    )

    def equivalents(self, suite_size: int) -> float:
        """Full-suite-equivalent runs: full runs plus subset tests as a fraction of the suite."""
        return self.full_runs + (self.subset_tests / suite_size if suite_size else 0.0)


COUNTER = RunCounter()


def read_addopts(root: Path) -> list[str]:
    """The project's configured pytest ``addopts`` (pytest's config-file precedence)."""
    root = Path(root)
    for name, section in (("pytest.ini", "pytest"), (".pytest.ini", "pytest")):
        if (root / name).is_file():
            return _ini_addopts(root / name, section)
    if (root / "pyproject.toml").is_file():
        try:
            tool = tomllib.loads((root / "pyproject.toml").read_text()).get("tool", {}).get("pytest", {})
        except (tomllib.TOMLDecodeError, UnicodeDecodeError):
            tool = {}
        if tool:
            opts = tool.get("ini_options", tool)
            value = opts.get("addopts", "")
            return list(value) if isinstance(value, list) else shlex.split(str(value))
    for name, section in (("tox.ini", "pytest"), ("setup.cfg", "tool:pytest")):
        if (root / name).is_file():
            found = _ini_addopts(root / name, section)
            if found is not None:
                return found
    return []


def _ini_addopts(path: Path, section: str) -> list[str] | None:
    cp = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        cp.read_string(path.read_text())
    except (configparser.Error, UnicodeDecodeError):
        return None
    if not cp.has_section(section):
        return None
    return shlex.split(cp.get(section, "addopts", fallback=""))


#: Options that change which tests run, stop early, parallelise, write outside the run, or clash with ours.
DENIED_ADDOPTS = {
    "-x",
    "--exitfirst",
    "--maxfail",
    "-n",
    "--numprocesses",
    "--dist",
    "--maxprocesses",
    "--lf",
    "--last-failed",
    "--ff",
    "--failed-first",
    "--nf",
    "--new-first",
    "--sw",
    "--stepwise",
    "--sw-skip",
    "--stepwise-skip",
    "--lfnf",
    "--last-failed-no-failures",
    "--pdb",
    "--pdbcls",
    "--trace",
    "--junitxml",
    "--junit-xml",
    "--junitprefix",
    "--basetemp",
    "--strict-config",
    "-c",
    "--config-file",
    "--rootdir",
    "--cache-clear",
    "--looponfail",
    "-f",
    "--co",
    "--collect-only",
    "--setup-only",
    "--setup-plan",
    "--fixtures",
    "--markers",
    "--version",
    "-h",
    "--help",
    "-o",
    "--override-ini",
    "--timeout",
    "--timeout-method",
    "--timeout_method",
    "--no-cov",
    "--count",
    "--reruns",
    "--random-order",
    "--random-order-seed",
    "-P",
    "--debug",
    "--report-log",
    "--result-log",
}
DENIED_PREFIXES = ("--cov", "--benchmark", "--randomly", "--mypy", "--flake8", "--pycodestyle", "--pylint")


def registered_options(python: Path, workspace: Path, timeout_s: float = 120.0) -> dict[str, bool]:
    """Options pytest accepts in this env and workspace (plugins + conftests): name -> takes a value."""
    code = (
        "import sys, pytest; sys.exit(pytest.main(['--help', '-p', 'no:cacheprovider', '-o', 'addopts=', "
        "'-o', 'required_plugins=']))"
    )
    proc = run_python(python, code, cwd=workspace, timeout_s=timeout_s)
    out: dict[str, bool] = {}
    for line in proc.stdout.splitlines():
        if not line.startswith("  -"):
            continue
        spec = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        for part in spec.split(", "):
            m = re.match(r"(-{1,2}[\w-]+)([ =]\S+)?", part.strip())
            if m:
                out[m.group(1)] = bool(m.group(2))
    return out


def safe_addopts(opts: list[str], registered: dict[str, bool] | None = None) -> list[str]:
    """The addopts that are safe to keep.

    Without ``registered`` (see :func:`registered_options`): only core options that need no plugin
    (doctest, ignore, warnings, ``-p no:...``). With it: any option pytest accepts in the env
    (e.g. ``--asyncio-mode=auto`` when pytest-asyncio is installed), minus those in
    :data:`DENIED_ADDOPTS` (early stop, xdist, coverage, ...). Unknown options are dropped with
    their value.
    """
    out: list[str] = []
    i = 0
    while i < len(opts):
        opt = opts[i]
        name, eq, _ = opt.partition("=")
        nxt = opts[i + 1] if i + 1 < len(opts) else None
        if opt == "-p" and nxt is not None:
            if nxt.startswith("no:"):
                out += [opt, nxt]
            i += 2
            continue
        if opt.startswith("-W") and len(opt) > 2:
            out.append(opt)
            i += 1
            continue
        if opt.startswith("-r") and len(opt) > 2 and not opt.startswith("--"):
            out.append(opt)
            i += 1
            continue
        if registered is None:
            takes_value = name in SAFE_ADDOPTS_WITH_VALUE
            keep = opt in SAFE_ADDOPTS_FLAGS or name in SAFE_ADDOPTS_WITH_VALUE
        else:
            takes_value = registered.get(name, bool(nxt) and not str(nxt).startswith("-"))
            keep = name in registered and name not in DENIED_ADDOPTS and not name.startswith(DENIED_PREFIXES)
        if not name.startswith("-"):
            i += 1  # a stray value
            continue
        if takes_value and not eq and nxt is not None:
            if keep:
                out += [opt, nxt]
            i += 2
            continue
        if keep:
            out.append(opt)
        i += 1
    return out


def pytest_args_for(root: Path, python: Path | None = None) -> list[str]:
    """Arguments every run of this project uses: neutralised addopts, fixed rootdir, robust collection.

    With ``python`` (a task env for ``root``), options of installed plugins survive; without it only
    plugin-free core options do.
    """
    registered = registered_options(python, root) if python is not None else None
    safe = safe_addopts(read_addopts(root), registered)
    return [
        "-o",
        f"addopts={shlex.join(safe)}",
        "-o",
        "required_plugins=",
        "--rootdir=.",
        "--continue-on-collection-errors",
    ]


def _test_file(node_id: str) -> str:
    return node_id.split("::", 1)[0]


def run_pytest(
    python: Path,
    workspace: Path,
    node_ids: list[str] | None = None,
    *,
    timeout_s: float = 600.0,
    per_test_timeout_s: float | None = 60.0,
    extra_args: list[str] | None = None,
    coverage_rc: Path | None = None,
    counter: RunCounter | None = None,
    plugins: list[str] | None = None,
    sandbox: SandboxConfig | None = None,
    bind_env: Path | None = None,
    writable: list[Path] | None = None,
) -> TestReport:
    """Run pytest with ``python`` in ``workspace`` through :func:`cadenza.testrun.run_tests`.

    On the host by default; with ``sandbox`` inside a one-shot bubblewrap sandbox (the environment
    read-only, only the workspace and the result channel writable, no network), as ``tasks verify``
    runs published tasks. ``plugins``: the environment's pytest plugins (see
    :func:`cadenza.testrun.env_plugins`); by default found from the environment's ``sys.path``.
    ``bind_env``: for a light env chained on a base env, the base env (probed once, cached) whose
    directories the sandbox binds; the light env's own directory is added read-only. ``writable``:
    directories the run may write besides the workspace (the coverage data of ``coverage_rc``).

    ``node_ids=None`` runs the configured suite; with ``node_ids`` only those tests run and IDs that
    never report count as failed. ``coverage_rc`` runs under ``coverage run`` with one coverage
    context per test node ID. The run is killed with its process group after ``timeout_s``.
    """
    workspace = Path(workspace)
    counter = counter if counter is not None else COUNTER
    env_dir = Path(python).parent.parent
    if plugins is None:
        plugins = env_plugins(env_info(env_dir).sys_path, [workspace])
    with tempfile.TemporaryDirectory(prefix="cadenza-run-") as tmp:
        channel = Path(tmp) / "channel"
        channel.mkdir()
        box = None
        if sandbox is not None:
            config = replace(sandbox, persistent=False)
            if bind_env is not None:
                config = replace(config, extra_ro_binds=[*config.extra_ro_binds, str(env_dir)])
            box = Sandbox(
                workspace, env_dir=bind_env or env_dir, config=config, rw_extra=[channel, *(writable or [])]
            )
        try:
            report = run_tests(
                python=python,
                workspace=workspace,
                node_ids=node_ids,
                executor=HostExecutor() if box is None else SandboxExecutor(box),
                channel_dir=channel,
                plugins=plugins,
                extra_args=extra_args,
                pythonpath=box.plan.pythonpath if box is not None else None,
                timeout_s=timeout_s,
                per_test_timeout_s=per_test_timeout_s,
                coverage_rc=coverage_rc,
            )
        finally:
            if box is not None:
                box.close()
    if node_ids is None:
        counter.full_runs += 1
    else:
        counter.subset_runs += 1
        counter.subset_tests += len(report.outcomes)  # tests that actually ran (``-x`` may stop early)
    counter.seconds += report.duration_s
    if sandbox is not None:
        SANDBOX_CPU.seconds += report.cpu_s
    return report
