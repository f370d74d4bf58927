"""Task building on a real local Ray cluster, pinned to loopback, against the local executor.

A Ray build publishes exactly the tasks a local build publishes (same ids, same F2P/P2P); a Ray
worker killed mid-build costs only the unit in flight (Ray re-runs it, the store's resume skips
what was published) and the retry is reported; no Ray listener leaves 127.0.0.1; nothing is written
to ``~/.ray``; bad addresses and a missing Ray fail in seconds with one line.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.support.tasks_helpers import make_repo, shared_env_cache

pytestmark = [pytest.mark.slow, pytest.mark.serial("ray")]

LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1", "::1"}


def _cmd(srcs, out: Path, *extra: str) -> list[str]:
    cmd = [sys.executable, "-m", "cadenza", "tasks", "build", *map(str, srcs), "--out", str(out)]
    return [*cmd, "--max-tasks", "2", "--levels", "1", "--seed", "1", "--quiet", *extra]


def _build(srcs, out: Path, env, *extra: str, check: bool = True, timeout: int = 900):
    res = subprocess.run(_cmd(srcs, out, *extra), env=env, capture_output=True, text=True, timeout=timeout)
    if check:
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res


def _tasks(out: Path) -> dict[str, tuple[list[str], list[str]]]:
    """task id -> (F2P, P2P), read from the published task.json files."""
    with sqlite3.connect(out / "index.sqlite") as con:
        ids = [r[0] for r in con.execute("SELECT id FROM tasks")]
    found = {}
    for tid in ids:
        t = json.loads((out / tid / "task.json").read_text())
        found[tid] = (sorted(t["fail_to_pass"]), sorted(t["pass_to_pass"]))
    return found


@pytest.fixture
def env(tmp_path, tmp_path_factory):
    home = tmp_path / "home"
    home.mkdir()
    return {
        **os.environ,
        "CADENZA_ENV_CACHE": str(shared_env_cache(tmp_path_factory)),
        "HOME": str(home),  # a run must not write ~/.ray (checked below)
    }


def _sources(root: Path) -> list[Path]:
    """Two local projects of two layouts (flat, src) and two names: two units, one per Ray worker."""
    named = textwrap.dedent("""\
        [project]
        name = "minilib-src"
        version = "0.3.1"
        dependencies = []

        [tool.pytest.ini_options]
        addopts = "--cov=minilib --cov-report=term -p pytest_cov"
        """)
    return [make_repo(root / "minilib"), make_repo(root / "minilib-src", layout="src", pyproject=named)]


@pytest.mark.network  # task venvs install their tooling with pip
def test_ray_build_equals_local_build_and_survives_a_killed_worker(tmp_path, env):
    """One local build is the reference; the Ray build of the same sources has one of its workers killed
    as soon as the first task is published, and still publishes exactly the local tasks, reporting the
    retry; its private cluster listens on loopback only (seen mid-build) and writes no ``~/.ray``. (A clean
    Ray run reports 0 retries: test_ray_reaper's rerun checks that.)"""
    srcs = _sources(tmp_path)
    _build(srcs, tmp_path / "local", env, "--workers", "2")
    local = _tasks(tmp_path / "local")
    assert len(local) == 4 and {t.split("-0.3.1")[0] for t in local} == {"minilib", "minilib-src"}, local

    # Kill a Ray worker running a source as soon as the first task is published.
    out = tmp_path / "ray"
    cmd = _cmd(srcs, out, "--workers", "2", "--executor", "ray")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed = niceness = None
    seen: list[tuple[str, int, str]] = []  # the private cluster's listeners, mid-build
    try:
        deadline = time.monotonic() + 600
        while killed is None and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
            if (out / "index.sqlite").exists() and _count(out) >= 1:
                seen = _listeners(proc.pid)
                killed, niceness = _kill_unit_worker(proc.pid)
        stdout, stderr = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert killed is not None, "the build finished before a worker could be killed"
    assert proc.returncode == 0, stdout[-2000:] + stderr[-2000:]
    assert _tasks(out) == local  # nothing lost, nothing twice, same ids and F2P/P2P as the local build
    assert "executor ray: 1 unit(s) retried after a worker died, 0 lost" in stdout, stdout
    # The private cluster listened on loopback only and wrote nothing to ~/.ray.
    names = {n for _, _, n in seen}
    assert any("gcs_server" in n for n in names) and any("raylet" in n for n in names), seen
    assert {ip for ip, _, _ in seen} <= LOOPBACK, seen
    assert not (Path(env["HOME"]) / ".ray").exists()
    assert niceness == os.nice(0)  # the unit ran at the driver's niceness, not Ray's default 15


def _count(out: Path) -> int:
    try:
        with sqlite3.connect(out / "index.sqlite", timeout=1) as con:
            return con.execute("SELECT COUNT(*) FROM tasks").fetchone()[0]
    except sqlite3.Error:
        return 0


def _kill_unit_worker(root: int) -> tuple[int | None, int | None]:
    """``(pid, niceness)`` of the unit worker killed, or ``(None, None)`` when none runs yet."""
    import psutil

    for p in psutil.Process(root).children(recursive=True):
        try:
            if p.name().startswith("ray::_call") or " ".join(p.cmdline()).startswith("ray::_call"):
                niceness = p.nice()
                os.kill(p.pid, signal.SIGKILL)
                return p.pid, niceness
        except psutil.Error:
            continue
    return None, None


def _listeners(root: int) -> list[tuple[str, int, str]]:
    """Every listening socket of ``root`` and its descendants: ``(address, port, process name)``."""
    import psutil

    seen = []
    try:
        procs = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
    except psutil.Error:
        return seen
    for p in procs:
        try:
            seen += [
                (c.laddr.ip, c.laddr.port, p.name())
                for c in p.net_connections("inet")
                if c.status == psutil.CONN_LISTEN
            ]
        except psutil.Error:
            continue
    return seen


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--ray-address", f"127.0.0.1:{_free_port()}"], "does not answer"),
        (["--ray-address", "nonsense"], "is not host:port"),
        (["--executor", "dask"], "unknown executor 'dask'"),
    ],
)
def test_bad_executor_input_is_one_line_before_any_work(tmp_path, env, extra, needle):
    if "--ray-address" in extra:
        extra = ["--executor", "ray", *extra]
    t0 = time.monotonic()
    res = _build([make_repo(tmp_path / "m")], tmp_path / "out", env, *extra, check=False, timeout=60)
    assert res.returncode == 2 and needle in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
    assert time.monotonic() - t0 < 30
    assert not (tmp_path / "out" / "index.sqlite").exists()  # nothing half-written


def test_missing_ray_is_one_line(tmp_path, env):
    code = (
        "import sys; sys.modules['ray'] = None; sys.argv = ['cadenza'] + sys.argv[1:]; "
        "from cadenza.cli import main; main()"
    )
    src = make_repo(tmp_path / "m")
    cmd = [
        sys.executable,
        "-c",
        code,
        "tasks",
        "build",
        str(src),
        "--out",
        str(tmp_path / "o"),
        "--executor",
        "ray",
    ]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "needs Ray, which is not installed" in res.stderr, res.stderr
    assert not (tmp_path / "o").exists()
