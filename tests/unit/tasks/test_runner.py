"""The pytest runner with a real pytest (this interpreter has pytest + pytest-timeout)."""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

from cadenza.tasks.deletion.baseline import combine_runs
from cadenza.tasks.sources.runner import RunCounter, pytest_args_for, read_addopts, run_pytest, safe_addopts

PY = Path(sys.executable)


def _ws(tmp_path: Path, files: dict[str, str]) -> Path:
    ws = tmp_path / "ws"
    for name, text in files.items():
        (ws / name).parent.mkdir(parents=True, exist_ok=True)
        (ws / name).write_text(textwrap.dedent(text))
    return ws


def test_outcomes_selection_and_missing_ids_count_failed(tmp_path: Path) -> None:
    ws = _ws(
        tmp_path,
        {
            "tests/test_a.py": """
            import pytest
            def test_ok(): pass
            def test_bad(): assert 0
            @pytest.mark.parametrize("x", [1, 2])
            def test_p(x): assert x == 1
            @pytest.mark.skip
            def test_skip(): pass
            @pytest.fixture
            def boom():
                yield
                raise RuntimeError("teardown")
            def test_teardown_error(boom): pass
        """,
            "tests/test_broken.py": "import no_such_module_xyz\ndef test_never(): pass\n",
        },
    )
    counter = RunCounter()
    full = run_pytest(PY, ws, None, timeout_s=120, per_test_timeout_s=None, counter=counter)
    assert full.outcomes == {
        "tests/test_a.py::test_ok": "passed",
        "tests/test_a.py::test_bad": "failed",
        "tests/test_a.py::test_p[1]": "passed",
        "tests/test_a.py::test_p[2]": "failed",
        "tests/test_a.py::test_skip": "skipped",
        "tests/test_a.py::test_teardown_error": "error",
    }
    assert full.collect_errors == ["tests/test_broken.py"]
    assert not (ws / ".pytest_cache").exists() and not list(ws.rglob("__pycache__"))
    ids = [
        "tests/test_a.py::test_ok",
        "tests/test_a.py::test_p[2]",
        "tests/test_broken.py::test_never",
        "tests/test_gone.py::test_x",
        "tests/test_a.py::test_renamed",
    ]
    sub = run_pytest(PY, ws, ids, timeout_s=120, per_test_timeout_s=None, counter=counter)
    assert set(sub.outcomes) == {"tests/test_a.py::test_ok", "tests/test_a.py::test_p[2]"}  # nothing else ran
    assert sub.passing == {"tests/test_a.py::test_ok"}
    assert sub.not_passing == set(ids) - {"tests/test_a.py::test_ok"}
    assert sub.outcome("tests/test_gone.py::test_x") == "missing" and not sub.passed(
        "tests/test_a.py::test_renamed"
    )
    assert counter.full_runs == 1 and counter.subset_runs == 1 and counter.subset_tests == 2
    assert counter.equivalents(6) == 1 + 2 / 6


def test_hung_suite_is_killed_with_its_process_group(tmp_path: Path) -> None:
    started, beat = tmp_path / "grandchild_started", tmp_path / "grandchild_beat"
    grandchild = (
        "import time\n"
        f"open({str(started)!r}, 'w').close()\n"
        "while True:\n"
        f"    with open({str(beat)!r}, 'a') as f: f.write('.')\n"
        "    time.sleep(0.05)\n"
    )
    ws = _ws(
        tmp_path,
        {
            "test_hang.py": f"""
        import os, subprocess, sys, time
        def test_first(): pass
        def test_hang():
            # A grandchild that would outlive a naive kill: it keeps writing heartbeats until killed.
            subprocess.Popen([sys.executable, "-c", {grandchild!r}])
            while not os.path.exists({str(started)!r}):
                time.sleep(0.01)
            time.sleep(600)
    """
        },
    )
    start = time.monotonic()
    rep = run_pytest(PY, ws, None, timeout_s=5, per_test_timeout_s=None)
    assert rep.timed_out and time.monotonic() - start < 30
    assert rep.outcome("test_hang.py::test_first") == "passed"
    assert rep.outcome("test_hang.py::test_hang") == "missing"
    assert started.exists(), (
        "the grandchild never started: the test proved nothing (rerun on a quieter machine)"
    )
    time.sleep(0.3)  # a heartbeat already in flight at the kill may still land
    size = beat.stat().st_size
    time.sleep(1.0)  # twenty heartbeats' worth
    assert size > 0 and beat.stat().st_size == size, "the grandchild survived the kill"


def test_per_test_timeout_fails_only_that_test(tmp_path: Path) -> None:
    ws = _ws(tmp_path, {"test_t.py": "import time\ndef test_slow(): time.sleep(60)\ndef test_fast(): pass\n"})
    rep = run_pytest(PY, ws, None, timeout_s=120, per_test_timeout_s=1)
    assert rep.outcomes == {"test_t.py::test_slow": "failed", "test_t.py::test_fast": "passed"}


def test_addopts_needing_plugins_are_neutralised(tmp_path: Path) -> None:
    addopts = "--cov=pkg --cov-report=term -p xdist -n 4 --doctest-modules -p no:warnings -x --strict-markers"
    ws = _ws(
        tmp_path,
        {
            "pyproject.toml": f"""
            [tool.pytest.ini_options]
            addopts = "{addopts}"
            required_plugins = ["pytest-cov"]
        """,
            "mod.py": '"""\n>>> 1 + 1\n2\n"""\n',
            "test_m.py": "def test_a(): assert 0\ndef test_b(): pass\n",
        },
    )
    assert read_addopts(ws)[0] == "--cov=pkg"
    assert safe_addopts(read_addopts(ws)) == ["--doctest-modules", "-p", "no:warnings", "--strict-markers"]
    rep = run_pytest(PY, ws, None, timeout_s=120, per_test_timeout_s=None, extra_args=pytest_args_for(ws))
    # -x was dropped (both tests ran); --doctest-modules kept (the doctest ran); --cov did not break the run.
    assert rep.outcomes == {
        "mod.py::mod": "passed",
        "test_m.py::test_a": "failed",
        "test_m.py::test_b": "passed",
    }


def test_addopts_from_setup_cfg_and_tox(tmp_path: Path) -> None:
    a = _ws(tmp_path / "a", {"setup.cfg": "[tool:pytest]\naddopts = --doctest-glob=*.rst --cov pkg\n"})
    assert safe_addopts(read_addopts(a)) == ["--doctest-glob=*.rst"]
    b = _ws(tmp_path / "b", {"tox.ini": "[pytest]\naddopts = -W error::DeprecationWarning --ignore=build\n"})
    assert safe_addopts(read_addopts(b)) == ["-W", "error::DeprecationWarning", "--ignore=build"]


def test_flaky_test_is_excluded_by_two_real_runs(tmp_path: Path) -> None:
    state = tmp_path / "ran_once"
    ws = _ws(
        tmp_path,
        {
            "test_f.py": f"""
        import os
        def test_flaky():
            first = not os.path.exists({str(state)!r})
            open({str(state)!r}, "w").close()
            assert not first
        def test_stable(): pass
        def test_broken(): assert 0
    """
        },
    )
    runs = [run_pytest(PY, ws, None, timeout_s=120, per_test_timeout_s=None) for _ in range(2)]
    assert runs[0].outcome("test_f.py::test_flaky") == "failed" and runs[1].passed("test_f.py::test_flaky")
    base = combine_runs(*runs)
    assert base.passing == ["test_f.py::test_stable"]
    assert base.excluded == ["test_f.py::test_broken", "test_f.py::test_flaky"]


def test_addopts_of_installed_plugins_and_conftests_survive(tmp_path: Path) -> None:
    ws = _ws(
        tmp_path,
        {
            "pytest.ini": "[pytest]\naddopts = --my-mode fast --runslow -x --maxfail=2 "
            "--nonexistent-plugin-opt=3 -m 'not net' -p no:warnings\n",
            "conftest.py": """
            def pytest_addoption(parser):
                parser.addoption("--my-mode", default="slow")
                parser.addoption("--runslow", action="store_true")
        """,
            "test_o.py": """
            import pytest
            def test_mode(request):
                assert request.config.getoption("--my-mode") == "fast"
                assert request.config.getoption("--runslow")
            @pytest.mark.net
            def test_net(): pass
            def test_fails(): assert 0
            def test_after(): pass
        """,
        },
    )
    args = pytest_args_for(ws, PY)
    assert args[:2] == ["-o", "addopts=--my-mode fast --runslow -m 'not net' -p no:warnings"]
    rep = run_pytest(PY, ws, None, timeout_s=120, per_test_timeout_s=None, extra_args=args)
    # Custom options reached the tests, -x/--maxfail did not stop the run, the marker expression still
    # applies.
    assert rep.outcomes == {
        "test_o.py::test_mode": "passed",
        "test_o.py::test_fails": "failed",
        "test_o.py::test_after": "passed",
    }
