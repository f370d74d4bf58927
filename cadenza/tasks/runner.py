"""Run pytest in a task environment and read back one outcome per explicit node ID.

Outcomes come from a tiny plugin (written to a private temp dir, never into the workspace) that
appends one JSON line per finished test, so a run killed half-way still reports what finished.
Rules the graders rely on: ``-p no:cacheprovider`` always; a requested node ID missing from the
report counts as failed; a hung run is killed with its whole process group.
"""

from __future__ import annotations

import configparser
import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

PLUGIN_NAME = "_cadenza_pytest_plugin"
PLUGIN_SOURCE = r"""
import json, os
import pytest

_OUT = os.environ["CADENZA_REPORT"]
_SELECT = os.environ.get("CADENZA_SELECT")
_state = {}


def _write(obj):
    with open(_OUT, "a") as fh:
        fh.write(json.dumps(obj) + "\n")


def pytest_collection_modifyitems(config, items):
    if not _SELECT:
        return
    with open(_SELECT) as fh:
        wanted = set(json.load(fh))
    keep = [i for i in items if i.nodeid in wanted]
    drop = [i for i in items if i.nodeid not in wanted]
    items[:] = keep
    if drop:
        config.hook.pytest_deselected(items=drop)


def pytest_collectreport(report):
    if report.failed:
        _write({"collect_error": report.nodeid})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    cov = None
    if os.environ.get("CADENZA_COV_CONTEXT"):
        import coverage
        cov = coverage.Coverage.current()
    if cov is not None:
        cov.switch_context(item.nodeid)
    yield
    if cov is not None:
        cov.switch_context("")


def pytest_runtest_logreport(report):
    nid = report.nodeid
    prev = _state.get(nid)
    if report.failed:
        out = "failed" if report.when == "call" else "error"
        if prev in ("failed", "error"):
            out = prev
    elif report.skipped:
        out = "xfailed" if hasattr(report, "wasxfail") else "skipped"
        if prev in ("failed", "error"):
            out = prev
    else:
        if report.when == "call":
            out = "xpassed" if hasattr(report, "wasxfail") else "passed"
        else:
            out = prev or "passed"
    _state[nid] = out
    if report.when == "teardown":
        _write({"nodeid": nid, "outcome": out})
"""

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

    def equivalents(self, suite_size: int) -> float:
        """Full-suite-equivalent runs: full runs plus subset tests as a fraction of the suite."""
        return self.full_runs + (self.subset_tests / suite_size if suite_size else 0.0)


COUNTER = RunCounter()


@dataclass(kw_only=True)
class TestReport:
    """Outcomes of one pytest run. ``outcomes`` maps node ID -> passed/failed/error/skipped/xfailed/xpassed."""

    __test__ = False  # not a pytest test class

    outcomes: dict[str, str]
    requested: list[str] | None
    exit_code: int
    timed_out: bool
    duration_s: float
    collect_errors: list[str] = field(default_factory=list)
    output_tail: str = ""

    def outcome(self, node_id: str) -> str:
        """The outcome of ``node_id``; ``"missing"`` (a failure) when the report lacks it."""
        return self.outcomes.get(node_id, "missing")

    def passed(self, node_id: str) -> bool:
        return self.outcome(node_id) == "passed"

    @property
    def passing(self) -> set[str]:
        ids = self.requested if self.requested is not None else list(self.outcomes)
        return {n for n in ids if self.outcomes.get(n) == "passed"}

    @property
    def not_passing(self) -> set[str]:
        """Requested (or reported) IDs that did not pass: failed, error, missing, skipped, xfail."""
        ids = self.requested if self.requested is not None else list(self.outcomes)
        return {n for n in ids if self.outcomes.get(n) != "passed"}


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


def _clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTHON", "PYTEST", "COV_", "COVERAGE", "VIRTUAL_ENV", "PIP_"))
    }
    env.update({"PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0", "PYTHONNOUSERSITE": "1"})
    env.update(extra or {})
    return env


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
) -> TestReport:
    """Run pytest with ``python`` in ``workspace``; ``node_ids=None`` runs the configured suite.

    With ``node_ids`` only those tests run (their files are passed to pytest and the plugin drops
    every other collected item); IDs that never report count as failed via :meth:`TestReport.outcome`.
    ``coverage_rc`` runs under ``coverage run`` with one coverage context per test node ID.
    The run is killed with its process group after ``timeout_s``.
    """
    workspace = Path(workspace)
    counter = counter if counter is not None else COUNTER
    with tempfile.TemporaryDirectory(prefix="cadenza-run-") as tmp:
        tmpd = Path(tmp)
        (tmpd / f"{PLUGIN_NAME}.py").write_text(PLUGIN_SOURCE)
        report_path = tmpd / "report.jsonl"
        env = _clean_env({"CADENZA_REPORT": str(report_path), "PYTHONPATH": str(tmpd)})
        # --tb=no last so it wins: formatting hundreds of tracebacks (a deletion that breaks many
        # tests) costs ~15x the CPU of the run itself, and outcomes come from the plugin anyway.
        args = [
            "-p",
            PLUGIN_NAME,
            "-p",
            "no:cacheprovider",
            "-q",
            "--rootdir=.",
            "--continue-on-collection-errors",
            *(extra_args or []),
            "--tb=no",
        ]
        if per_test_timeout_s:
            args.append(f"--timeout={per_test_timeout_s:g}")
        if node_ids is not None:
            select = tmpd / "select.json"
            select.write_text(json.dumps(list(node_ids)))
            env["CADENZA_SELECT"] = str(select)
            files = sorted({_test_file(n) for n in node_ids if (workspace / _test_file(n)).exists()})
            if not files:
                counter.subset_runs += 1
                return TestReport(
                    outcomes={}, requested=list(node_ids), exit_code=4, timed_out=False, duration_s=0.0
                )
            args += files
        if coverage_rc is not None:
            env["CADENZA_COV_CONTEXT"] = "1"
            cmd = [str(python), "-m", "coverage", "run", f"--rcfile={coverage_rc}", "-m", "pytest", *args]
        else:
            cmd = [str(python), "-m", "pytest", *args]
        log_path = tmpd / "output.log"
        start = time.monotonic()
        timed_out = False
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                cmd,
                cwd=workspace,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
        duration = time.monotonic() - start
        outcomes: dict[str, str] = {}
        collect_errors: list[str] = []
        if report_path.exists():
            for line in report_path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut by a kill
                if "collect_error" in rec:
                    collect_errors.append(rec["collect_error"])
                else:
                    outcomes[rec["nodeid"]] = rec["outcome"]
        tail = log_path.read_bytes()[-4000:].decode(errors="replace")
    if node_ids is None:
        counter.full_runs += 1
    else:
        counter.subset_runs += 1
        counter.subset_tests += len(outcomes)  # tests that actually ran (``-x`` may stop early)
    counter.seconds += duration
    return TestReport(
        outcomes=outcomes,
        requested=list(node_ids) if node_ids is not None else None,
        exit_code=proc.returncode if not timed_out else -9,
        timed_out=timed_out,
        duration_s=duration,
        collect_errors=collect_errors,
        output_tail=tail,
    )


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_python(
    python: Path, code: str, *, cwd: Path, timeout_s: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """Run a snippet in the task environment (clean env, no bytecode written), killed on timeout."""
    proc = subprocess.Popen(
        [str(python), "-c", code],
        cwd=cwd,
        env=_clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return subprocess.CompletedProcess(proc.args, -9, "", "timed out")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
