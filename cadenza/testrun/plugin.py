"""The pytest plugin of cadenza's one test runner (loaded with ``-p``, before any workspace code).

It is deployed by copying this file into the run's private channel directory, so it imports nothing
from cadenza. At import time, which pytest reaches before any conftest, package or test module, it:

- reads the run's config and the per-run key from the channel directory and unlinks the key file, so
  code imported later cannot learn it from the file system;
- binds every function it will need later (``json.dumps``, ``hmac``, ``os.write``) and snapshots the
  identity of the test runner's machinery (``_pytest`` runner/report/terminal modules, ``pluggy``,
  this module), so a later monkeypatch of any of it is visible;
- opens the result file (append only) once.

Every finished test is written as one record authenticated with HMAC-SHA256 over a sequence number
and the record; the trusted parent (:mod:`cadenza.testrun.channel`) rejects a record it cannot verify.
A test whose call raised but whose final report says "passed" (a rewritten report), a reporting hook
implemented by a plugin from the workspace, or a replaced runner function is reported as tampering
in the final record, which the parent requires.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import resource
import sys
import types

import pytest

_DIR = os.environ.get("CADENZA_TESTRUN_DIR", "")
_CONFIG: dict = {}
if _DIR:
    with open(os.path.join(_DIR, "config.json")) as _fh:
        _CONFIG = json.load(_fh)
_CHECKS: dict = _CONFIG.get("checks", {})
_WORKSPACE = os.path.realpath(os.getcwd())
#: Hooks through which a plugin decides or rewrites a test's outcome.
REPORT_HOOKS = (
    "pytest_runtest_makereport",
    "pytest_runtest_logreport",
    "pytest_report_teststatus",
    "pytest_runtest_protocol",
    "pytest_runtest_call",
    "pytest_pyfunc_call",
)
WATCHED_MODULES = (
    "pytest",
    "_pytest.runner",
    "_pytest.reports",
    "_pytest.main",
    "_pytest.python",
    "_pytest.nodes",
    "_pytest.terminal",
    "_pytest.skipping",
    "_pytest.outcomes",
    "_pytest.unittest",
    "_pytest.config",
    "pluggy",
    "pluggy._callers",
    "pluggy._hooks",
    "pluggy._manager",
    "pluggy._result",
    "json",
    "json.encoder",
    "hmac",
    "hashlib",
    __name__,
)


def _callables(ns: dict) -> dict[str, object]:
    return {
        k: v
        for k, v in ns.items()
        if isinstance(
            v, (types.FunctionType, type, classmethod, staticmethod, property, types.BuiltinFunctionType)
        )
    }


#: Checked after every test (cheap); the whole snapshot is checked once, at the end of the session.
CRITICAL = frozenset(
    {
        "_pytest.runner",
        "_pytest.runner.CallInfo",
        "_pytest.reports.TestReport",
        "_pytest.python.Function",
        "pluggy._callers",
        "pluggy._hooks.HookCaller",
        "pluggy._hooks._HookCaller",
        "pluggy._result.Result",
        "pluggy._result._Result",
        __name__,
    }
)


def snapshot() -> list[tuple[str, object, dict[str, object]]]:
    """(name, owner, its callables) for every watched module and every class defined in one."""
    out = []
    for name in WATCHED_MODULES:
        mod = sys.modules.get(name)
        if mod is None:
            continue
        out.append((name, mod, _callables(vars(mod))))
        for attr, value in list(vars(mod).items()):
            if isinstance(value, type) and getattr(value, "__module__", None) == name:
                out.append((f"{name}.{attr}", value, _callables(vars(value))))
    return out


def _trusted_roots() -> tuple[str, ...]:
    roots = []
    for name in ("_pytest", "pluggy"):
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "__file__", None):
            roots.append(os.path.dirname(os.path.realpath(mod.__file__)) + os.sep)
    return tuple(roots)


_ROOTS = _trusted_roots()


def _from_runner(obj: object) -> bool:
    """Whether ``obj`` is defined by pytest or pluggy themselves (pytest's own plugins patch classes
    at configure time, e.g. the legacy-path properties); its code's file decides, not ``__module__``."""
    for fn in (getattr(obj, "fget", None), getattr(obj, "__func__", None), obj):
        code = getattr(fn, "__code__", None)
        if code is not None:
            return os.path.realpath(code.co_filename).startswith(_ROOTS)
    if isinstance(obj, type):
        mod = sys.modules.get(obj.__module__)
        return os.path.realpath(getattr(mod, "__file__", None) or "/").startswith(_ROOTS)
    return False


def changed(snap: list[tuple[str, object, dict[str, object]]]) -> list[str]:
    """What was replaced, added or removed since ``snap`` by code other than pytest's own."""
    found = []
    for name, owner, before in snap:
        if isinstance(owner, types.ModuleType) and sys.modules.get(name) is not owner:
            found.append(f"sys.modules[{name!r}] replaced")
        now = _callables(vars(owner))
        for attr in before.keys() | now.keys():
            new = now.get(attr)
            if before.get(attr) is new or (new is not None and _from_runner(new)):
                continue
            found.append(f"{name}.{attr} {'replaced' if attr in before else 'added'}")
    return found


def _make_writer():
    """The record writer: key, sequence and file stay in this closure, not in module globals."""
    if not _DIR:
        return lambda rec: None
    key_path = os.path.join(_DIR, "key")
    with open(key_path, "rb") as fh:
        key = fh.read()
    os.unlink(key_path)
    fd = os.open(os.path.join(_DIR, "results.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    dumps, new, sha, write = json.dumps, hmac.new, hashlib.sha256, os.write
    seq = [0]

    def emit(rec: dict) -> None:
        body = dumps(rec, sort_keys=True)
        mac = new(key, f"{seq[0]}:{body}".encode(), sha).hexdigest()
        write(fd, (dumps({"seq": seq[0], "body": body, "mac": mac}) + "\n").encode())
        seq[0] += 1

    return emit


_emit = _make_writer()
_state: dict[str, str] = {}
_raised: dict[str, bool] = {}
_tamper: list[str] = []


def _note(evidence: str) -> None:
    if evidence not in _tamper:
        _tamper.append(evidence)


def pytest_collection_modifyitems(config, items):
    wanted = _CONFIG.get("select")
    if wanted is None:
        return
    wanted = set(wanted)
    keep = [i for i in items if i.nodeid in wanted]
    drop = [i for i in items if i.nodeid not in wanted]
    items[:] = keep
    if drop:
        config.hook.pytest_deselected(items=drop)


def pytest_collectreport(report):
    if report.failed:
        _emit({"kind": "collect_error", "nodeid": report.nodeid})


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    cov = None
    if _CONFIG.get("cov_context"):
        import coverage

        cov = coverage.Coverage.current()
    if cov is not None:
        cov.switch_context(item.nodeid)
    yield
    if cov is not None:
        cov.switch_context("")


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_call(item):
    outcome = yield
    _raised[item.nodeid] = outcome.excinfo is not None


def _outcome(report, prev: str | None) -> str:
    if report.failed:
        out = "failed" if report.when == "call" else "error"
        return prev if prev in ("failed", "error") else out
    if report.skipped:
        out = "xfailed" if hasattr(report, "wasxfail") else "skipped"
        return prev if prev in ("failed", "error") else out
    if report.when == "call":
        return "xpassed" if hasattr(report, "wasxfail") else "passed"
    return prev or "passed"


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    result = yield
    report = result.get_result()
    nid = item.nodeid
    if _CHECKS.get("call_vs_report", True) and call.when == "call":
        raised = _raised.get(nid, False) or call.excinfo is not None
        if raised and report.passed:
            _note(f"{nid}: the test raised but its report says passed")
    out = _outcome(report, _state.get(nid))
    _state[nid] = out
    if call.when == "teardown":
        if _CHECKS.get("integrity", True):
            for evidence in changed(_CRITICAL_SNAPSHOT):
                _note(f"{evidence} (during {nid})")
        _emit({"kind": "test", "nodeid": nid, "outcome": out})


def foreign_report_hooks(pluginmanager) -> list[str]:
    """Reporting hooks whose code comes from a workspace file other than a (restored) conftest.py.

    The function's own code file decides, so a function from the workspace put in place of one of
    pytest's registered hook functions counts too.
    """
    found = []
    for hook in REPORT_HOOKS:
        caller = getattr(pluginmanager.hook, hook, None)
        for impl in caller.get_hookimpls() if caller is not None else []:
            code = getattr(impl.function, "__code__", None)
            path = os.path.realpath(code.co_filename) if code is not None else ""
            if path.startswith(_WORKSPACE + os.sep) and os.path.basename(path) != "conftest.py":
                found.append(f"{hook} implemented by {os.path.relpath(path, _WORKSPACE)}")
    return found


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    if _CHECKS.get("integrity", True):
        for evidence in changed(_SNAPSHOT) + foreign_report_hooks(session.config.pluginmanager):
            _note(evidence)
    use = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    cpu = sum(u.ru_utime + u.ru_stime for u in use)  # the host cannot see a sandboxed run's CPU time
    end = {"kind": "end", "tests": len(_state), "tamper": list(_tamper), "exitstatus": int(exitstatus)}
    _emit({**end, "cpu_s": round(cpu, 3)})


_SNAPSHOT = snapshot()  # last, so that this module's own functions are in it
_CRITICAL_SNAPSHOT = [entry for entry in _SNAPSHOT if entry[0] in CRITICAL]
_emit({"kind": "start", "pid": os.getpid()})
