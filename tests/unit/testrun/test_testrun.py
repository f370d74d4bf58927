"""The one test runner: the verified channel (forged/reordered/duplicated/unknown records, a missing
final record) with each check switched off in turn, and real pytest runs without false alarms."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from cadenza.testrun import Checks, HostExecutor, env_plugins, run_tests
from cadenza.testrun.channel import GUARD_EXIT, read_channel


def _frame(seq: int, rec: dict) -> str:
    return json.dumps({"seq": seq, **rec}, sort_keys=True)


def _test(nid: str, outcome: str = "passed") -> dict:
    return {"kind": "test", "nodeid": nid, "outcome": outcome}


END = {"kind": "end", "tests": 1, "tamper": [], "exitstatus": 0}
START = {"kind": "start", "pid": 1}


def _read(tmp_path: Path, lines: list[str], *, off: str | None = None, exit_code: int | None = 0, req=("a",)):
    path = tmp_path / "results.jsonl"
    path.write_text("\n".join(lines) + "\n")
    checks = Checks(**({off: False} if off else {}))
    return read_channel(path, requested=list(req), checks=checks, exit_code=exit_code)


def test_records_in_sequence_are_read(tmp_path: Path):
    got = _read(tmp_path, [_frame(0, START), _frame(1, _test("a")), _frame(2, END)])
    assert got.outcomes == {"a": "passed"} and got.tampering == [] and got.complete


@pytest.mark.parametrize(
    "name,lines,check,evidence",
    [
        (
            "reordered",
            [_frame(0, START), _frame(2, _test("a")), _frame(1, END)],
            "sequence",
            "out of sequence",
        ),
        (
            "after_the_end",
            [_frame(0, START), _frame(1, _test("a", "failed")), _frame(2, END), _frame(3, _test("a"))],
            "sequence",
            "after the final record",
        ),
        (
            "garbage_line",
            [_frame(0, START), "{not json", _frame(1, _test("a")), _frame(2, END)],
            "sequence",
            "unreadable",
        ),
        (
            "duplicate",
            [_frame(0, START), _frame(1, _test("a")), _frame(2, _test("a")), _frame(3, END)],
            "node_ids",
            "reported twice",
        ),
        (
            "unknown",
            [_frame(0, START), _frame(1, _test("a")), _frame(2, _test("zz")), _frame(3, END)],
            "node_ids",
            "not requested",
        ),
        (
            "no_end_record",
            [_frame(0, START), _frame(1, _test("a"))],
            "end_record",
            "before the runner's final",
        ),
    ],
)
def test_each_channel_check_catches_its_forgery_and_only_it(tmp_path: Path, name, lines, check, evidence):
    on = _read(tmp_path, lines)
    assert any(evidence in t for t in on.tampering), on.tampering
    off = _read(tmp_path, lines, off=check)
    assert not any(evidence in t for t in off.tampering), off.tampering


def test_a_cut_last_line_is_no_evidence_and_a_crash_without_end_is_not_either(tmp_path: Path):
    got = _read(tmp_path, [_frame(0, START), _frame(1, _test("a")), '{"seq": 2, "ki'], exit_code=-9)
    assert got.tampering == [] and got.outcomes == {"a": "passed"} and not got.complete


def test_the_guards_record_or_status_is_tampering(tmp_path: Path):
    rec = {"kind": "guard", "capability": "gc", "event": "gc.get_objects", "where": "pkg/a.py:3"}
    got = _read(tmp_path, [_frame(0, START), _frame(1, rec)], exit_code=GUARD_EXIT)
    assert got.tampering == ["the guard ended the test process: gc (gc.get_objects) at pkg/a.py:3"]
    bare = _read(tmp_path, [_frame(0, START)], exit_code=GUARD_EXIT)
    assert bare.tampering == [f"the test process exited with the guard's status {GUARD_EXIT}"]


def _ws(tmp_path: Path, files: dict[str, str]) -> Path:
    ws = tmp_path / "ws"
    for name, text in files.items():
        (ws / name).parent.mkdir(parents=True, exist_ok=True)
        (ws / name).write_text(textwrap.dedent(text))
    return ws


def _run(tmp_path: Path, ws: Path, ids: list[str] | None, **kw):
    return run_tests(
        python=sys.executable,
        workspace=ws,
        node_ids=ids,
        executor=HostExecutor(),
        channel_dir=tmp_path / "chan",
        plugins=env_plugins(sys.path, [ws]),
        per_test_timeout_s=None,
        timeout_s=120,
        **kw,
    )


SUITE = {
    "conftest.py": """
        import pytest

        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_makereport(item, call):  # a project's benign reporting hook
            yield

        @pytest.fixture
        def boom():
            yield
            raise RuntimeError("teardown")
    """,
    "tests/test_a.py": """
        import os, unittest, pytest

        def test_ok(monkeypatch):
            monkeypatch.setattr(os, "getcwd", lambda: "/")
        def test_bad(): assert 0
        @pytest.mark.xfail
        def test_xf(): assert 0
        @pytest.mark.skip
        def test_skip(): pass
        def test_teardown_error(boom): pass
        class T(unittest.TestCase):
            def test_u(self): self.assertEqual(1, 2)
            def test_v(self): pass
    """,
}


def test_a_real_suite_reports_exact_outcomes_without_false_alarms(tmp_path: Path):
    ws = _ws(tmp_path, SUITE)
    rep = _run(tmp_path, ws, None)
    assert rep.tampering == [] and rep.complete, rep.output_tail
    assert rep.outcomes == {
        "tests/test_a.py::test_ok": "passed",
        "tests/test_a.py::test_bad": "failed",
        "tests/test_a.py::test_xf": "xfailed",
        "tests/test_a.py::test_skip": "skipped",
        "tests/test_a.py::test_teardown_error": "error",
        "tests/test_a.py::T::test_u": "failed",
        "tests/test_a.py::T::test_v": "passed",
    }
    assert not (tmp_path / "chan" / "key").exists()  # no secret is ever handed to the test process


def test_tampering_fails_every_node(tmp_path: Path):
    ws = _ws(
        tmp_path,
        {
            "pkg/__init__.py": "import _pytest.runner\n_pytest.runner.call_and_report = lambda *a, **k: "
            "None\n",
            "tests/test_b.py": "import pkg\ndef test_ok(): pass\n",
        },
    )
    rep = _run(tmp_path, ws, ["tests/test_b.py::test_ok"])
    assert any("call_and_report replaced" in t for t in rep.tampering), rep.tampering
    assert rep.statuses(["tests/test_b.py::test_ok"]) == {"tests/test_b.py::test_ok": "tampered"}
    assert rep.passing == set()


def test_the_callers_python_and_pytest_variables_never_reach_the_run(tmp_path: Path, monkeypatch):
    """PYTEST_ADDOPTS/PYTEST_PLUGINS/PYTHONPATH/PYTHONSTARTUP set around the runner change nothing."""
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "evil_plugin.py").write_text(
        "import pytest\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
        "    r = (yield).get_result()\n    r.outcome = 'passed'\n"
    )
    (evil / "sitecustomize.py").write_text("raise SystemExit(3)\n")
    for name, value in {
        "PYTEST_ADDOPTS": "-p evil_plugin",
        "PYTEST_PLUGINS": "evil_plugin",
        "PYTHONPATH": str(evil),
        "PYTHONSTARTUP": str(evil / "sitecustomize.py"),
    }.items():
        monkeypatch.setenv(name, value)
    ws = _ws(tmp_path, {"tests/test_c.py": "def test_bad(): assert 0\n"})
    rep = _run(tmp_path, ws, ["tests/test_c.py::test_bad"])
    assert rep.outcomes == {"tests/test_c.py::test_bad": "failed"} and rep.tampering == [], rep.output_tail


def test_a_patch_of_any_imported_module_by_workspace_code_is_evidence(tmp_path: Path):
    """The broad snapshot: not only pytest's modules. Package code that neuters ``unittest``'s assertions
    (an unwatched stdlib module) makes a failing unittest-style test pass; the integrity check sees it."""
    ws = _ws(
        tmp_path,
        {
            "pkg/__init__.py": "import unittest\n\n\ndef _quiet(self, *a, **k):\n    return None\n\n\n"
            "unittest.TestCase.assertEqual = _quiet\n",
            "tests/test_u.py": "import unittest\n\nimport pkg\n\n\nclass T(unittest.TestCase):\n"
            "    def test_u(self):\n        self.assertEqual(1, 2)\n",
        },
    )
    node = "tests/test_u.py::T::test_u"
    on = _run(tmp_path, ws, [node])
    assert any("unittest.case.TestCase.assertEqual replaced" in t for t in on.tampering), on.tampering
    assert on.passing == set()
    off = _run(tmp_path / "off", ws, [node], checks=Checks(integrity=False))
    assert off.tampering == [] and off.passing == {node}


def test_confcutdir_keeps_a_conftest_above_the_workspace_out(tmp_path: Path):
    """Where pytest's own default would not: a configuration file above the workspace makes pytest's
    default ``confcutdir`` that directory, so its ``conftest.py`` (here, one that passes every test) loads
    in a plain pytest run; the runner's ``--confcutdir`` at the workspace keeps it out. (In the grading
    sandbox nothing sits above the workspace when pytest starts, and a conftest written there at run
    time is the guard's: ``conftest_above_workspace``.)"""
    import subprocess

    parent = tmp_path / "above"
    ws = parent / "ws"
    (ws / "tests").mkdir(parents=True)
    (ws / "tests" / "test_x.py").write_text("def test_x():\n    assert False\n")
    (parent / "pytest.ini").write_text("[pytest]\n")
    (parent / "conftest.py").write_text(
        "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
        "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n"
    )
    node = "tests/test_x.py::test_x"
    plain = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir=.", node],
        cwd=ws,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plain.returncode == 0 and "1 passed" in plain.stdout, plain.stdout  # the conftest above loaded
    rep = run_tests(
        python=sys.executable,
        workspace=ws,
        node_ids=[node],
        executor=HostExecutor(),
        channel_dir=tmp_path / "chan",
        plugins=env_plugins(sys.path, [ws]),
        per_test_timeout_s=None,
        timeout_s=120,
    )
    assert rep.statuses([node]) == {node: "failed"}, (rep.tampering, rep.output_tail)
