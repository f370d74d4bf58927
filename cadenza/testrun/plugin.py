"""The pytest plugin of cadenza's one test runner, handed to ``pytest.main`` by :mod:`boot`.

It is copied into the run's private channel directory and loaded by file path under a per-run random
name, so it imports nothing from cadenza and is never found through ``sys.path``. :mod:`boot` injects
``_BOOT = (config, emit)`` before this module runs (before any conftest, package or test module):

- every finished test is one numbered record; the parent fixes which node ids run and in what order,
  and checks the records against that (a record is evidence only of what this process said);
- the identity of the machinery that decides outcomes is snapshotted now: pytest's runner, report
  and terminal modules, ``pluggy``, ``json`` and this module strictly (any replacement not made by
  pytest itself), and every other module already imported (stdlib, third-party) for replacements by
  workspace code; a test whose call raised but whose final report says "passed" (a rewritten report)
  and a reporting hook implemented by a workspace file are noted too.

Evidence goes into the final record. None of this is what makes the verdict trustworthy (code in this
process can reach all of it): the parent's capability check and the guard are; these checks make the
generic patches of pytest visible and cost nothing.
"""

from __future__ import annotations

import os
import resource
import sys
import types

import pytest

_CONFIG, _emit = globals().get("_BOOT") or getattr(sys, "_cadenza_boot", None) or ({}, lambda rec: None)
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
    __name__,
)


CALLABLE_TYPES = (types.FunctionType, type, classmethod, staticmethod, property, types.BuiltinFunctionType)


def _callables(ns: dict) -> dict[str, object]:
    return {k: v for k, v in ns.items() if isinstance(v, CALLABLE_TYPES)}


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


def snapshot(names=WATCHED_MODULES, pick=_callables) -> list[tuple[str, object, dict[str, object]]]:
    """(name, owner, ``pick`` of its namespace) for every module in ``names`` and every class defined
    in one (the broad snapshot copies namespaces whole: cheaper than sorting out callables now)."""
    out = []
    for name in names:
        mod = sys.modules.get(name)
        if mod is None or not isinstance(mod, types.ModuleType):
            continue
        ns = vars(mod)
        out.append((name, mod, pick(ns)))
        for attr, value in list(ns.items()):
            if isinstance(value, type) and getattr(value, "__module__", None) == name:
                out.append((f"{name}.{attr}", value, pick(vars(value))))
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


def _from_workspace(obj: object) -> bool:
    """Whether ``obj``'s code lives in a workspace file (or was compiled from a string there)."""
    for fn in (getattr(obj, "fget", None), getattr(obj, "__func__", None), obj):
        code = getattr(fn, "__code__", None)
        if code is not None:
            path = code.co_filename
            return path.startswith("<") or os.path.realpath(path).startswith(_WORKSPACE + os.sep)
    if isinstance(obj, type):
        mod = sys.modules.get(obj.__module__)
        path = getattr(mod, "__file__", None) or ""
        return bool(path) and os.path.realpath(path).startswith(_WORKSPACE + os.sep)
    return False


def changed(snap: list[tuple[str, object, dict[str, object]]], *, strict: bool = True) -> list[str]:
    """What was replaced, added or removed since ``snap``: by anything but pytest itself (``strict``),
    or by workspace code (the broad snapshot of every other module: stdlib, third-party)."""
    found = []
    for name, owner, before in snap:
        if isinstance(owner, types.ModuleType) and sys.modules.get(name) is not owner:
            found.append(f"sys.modules[{name!r}] replaced")
        now = vars(owner)
        for attr in before.keys() | now.keys():
            new = now.get(attr)
            if before.get(attr) is new:
                continue
            if not isinstance(new, CALLABLE_TYPES) and not isinstance(before.get(attr), CALLABLE_TYPES):
                continue
            if strict and new is not None and _from_runner(new):
                continue
            if not strict and not (new is not None and _from_workspace(new)):
                continue
            found.append(f"{name}.{attr} {'replaced' if attr in before else 'added'}")
    return found


def _broad_names() -> list[str]:
    """Every imported module not watched strictly and not from the workspace."""
    out = []
    for name, mod in list(sys.modules.items()):
        path = getattr(mod, "__file__", None) or ""
        if name in WATCHED_MODULES or (path and os.path.realpath(path).startswith(_WORKSPACE + os.sep)):
            continue
        out.append(name)
    return out


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
    if _CONFIG.get("reverse"):  # the parent's second run: the same tests, in the opposite order
        keep.reverse()
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
        if _CHECKS.get("integrity_per_test", True):  # a patch restored before the end is seen here
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
        found = changed(_SNAPSHOT) + changed(_BROAD, strict=False)
        for evidence in found + foreign_report_hooks(session.config.pluginmanager):
            _note(evidence)
    use = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    cpu = sum(u.ru_utime + u.ru_stime for u in use)  # the host cannot see a sandboxed run's CPU time
    end = {"kind": "end", "tests": len(_state), "tamper": list(_tamper), "exitstatus": int(exitstatus)}
    _emit({**end, "cpu_s": round(cpu, 3)})


_SNAPSHOT = snapshot()  # last, so that this module's own functions are in it
_BROAD = snapshot(_broad_names(), pick=dict) if _CHECKS.get("integrity", True) else []
_CRITICAL_SNAPSHOT = [entry for entry in _SNAPSHOT if entry[0] in CRITICAL]
_emit({"kind": "start", "pid": os.getpid()})
