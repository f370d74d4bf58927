"""A private Ray cluster never outlives its driver: a real ``cadenza tasks build --executor ray`` is
killed mid-build with SIGTERM and (rerun) with SIGKILL; within a bounded time no process of that cluster is
left (judged by the driver's process tree and by the cluster's own directory, never by process name:
other tests may run Ray meanwhile), none of the ``/dev/shm`` files they had mapped remain, the
cluster's session files are gone, and rerunning the same command resumes the store to the full task
set.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from tests.support.tasks_helpers import make_repo, shared_env_cache

pytestmark = [pytest.mark.slow, pytest.mark.serial("ray"), pytest.mark.network]  # the build pip-installs

BOUND_S = 30.0  # every process of the cluster is gone this long after the driver died


def _published(out: Path) -> set[str]:
    try:
        with sqlite3.connect(out / "index.sqlite", timeout=1) as con:
            return {r[0] for r in con.execute("SELECT id FROM tasks")}
    except sqlite3.Error:
        return set()


def _tree(pid: int) -> dict[int, float]:
    """The driver and its descendants (Ray's processes, the supervisor, the build's pytest runs)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return {}
    out = {}
    for p in procs:
        try:
            out[p.pid] = p.create_time()
        except psutil.Error:
            continue
    return out


def _still_alive(procs: dict[int, float]) -> list[str]:
    alive = []
    for pid, created in procs.items():
        try:
            p = psutil.Process(pid)
            if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{pid} {p.name()}")
        except psutil.Error:
            continue
    return alive


def _users_of(dirs: list[Path]) -> list[str]:
    """Every process on the machine with its cwd, command line or an open file under ``dirs``."""
    prefixes = tuple(str(d.resolve()) + os.sep for d in dirs)
    found = []
    for p in psutil.process_iter():
        try:
            paths = [p.cwd(), " ".join(p.cmdline()), *(f.path for f in p.open_files())]
        except psutil.Error:
            continue
        if any(pre in path or path.startswith(pre) for path in paths for pre in prefixes):
            found.append(f"{p.pid} {p.name()}")
    return found


def _shm(procs: dict[int, float]) -> set[str]:
    """``/dev/shm`` files the given processes map (Ray's object store arenas, if any)."""
    found = set()
    for pid in procs:
        try:
            found |= {m.path for m in psutil.Process(pid).memory_maps() if m.path.startswith("/dev/shm/")}
        except psutil.Error:
            continue
    return found


def test_killed_driver_leaves_no_cluster_and_the_rerun_resumes(tmp_path, tmp_path_factory):
    """The same build is killed twice (SIGTERM, then SIGKILL on its rerun), each time mid-build; after
    each kill nothing of its cluster is left; a third, clean run resumes the store to the full set."""
    src = make_repo(tmp_path / "minilib")
    out = tmp_path / "out"
    tmp = Path(tempfile.mkdtemp(prefix="crk-", dir="/tmp"))  # short: the cluster's dir lands under it
    env = {
        **os.environ,
        "CADENZA_ENV_CACHE": str(shared_env_cache(tmp_path_factory)),
        "HOME": str(tmp_path / "home"),
        "TMPDIR": str(tmp),
    }
    cluster_dirs = [tmp, out / ".work" / "ray"]  # a short --out keeps the cluster there instead
    cmd = [sys.executable, "-m", "cadenza", "tasks", "build", str(src), "--out", str(out), "--max-tasks", "2"]
    cmd += ["--levels", "1", "--seed", "1", "--quiet", "--executor", "ray"]
    procs: dict[int, float] = {}
    try:
        published: set[str] = set()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            before, killed, shm, (rc, stderr) = _kill_mid_build(cmd, env, out, sig)
            procs.update(killed)
            assert published <= before, (sig, published, before)  # a killed run loses nothing published
            published = before
            if sig == signal.SIGTERM:  # a clean shutdown: unwound like Ctrl-C, no traceback, no abort
                assert rc == 128 + signal.SIGTERM and "Traceback" not in stderr, (rc, stderr[-3000:])

            deadline = time.monotonic() + BOUND_S
            while (_still_alive(killed) or _users_of(cluster_dirs)) and time.monotonic() < deadline:
                time.sleep(0.5)
            assert not _still_alive(killed), (
                f"{sig!r}: processes of the killed cluster remain: {_still_alive(killed)}"
            )
            assert not _users_of(cluster_dirs), (sig, _users_of(cluster_dirs))
            assert not [f for f in shm if Path(f).exists()], (sig, shm)
            assert not _session_files(cluster_dirs), (
                f"{sig!r}: the cluster's files remain: {_session_files(cluster_dirs)}"
            )

        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)  # the rerun resumes
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        after = _published(out)
        assert len(after) == 2 and published <= after, (published, after)
        assert "executor ray: 0 unit(s) retried" in res.stdout, res.stdout
        assert not _session_files(cluster_dirs)  # a clean run cleans up too
    finally:  # a failed check must not leave its processes to the next test
        for pid, created in procs.items():
            with contextlib.suppress(psutil.Error):
                if psutil.Process(pid).create_time() == created:
                    psutil.Process(pid).kill()
        shutil.rmtree(tmp, ignore_errors=True)


def _kill_mid_build(cmd: list[str], env: dict[str, str], out: Path, sig: int):
    """Start the build, send ``sig`` to the driver while a Ray worker is building; returns the tasks
    published before, the driver's descendants and the ``/dev/shm`` files they mapped, and the driver's
    exit code and stderr."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        busy_since = None
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
            if busy_since is None and any(_name(p).startswith("ray::_call") for p in _tree(proc.pid)):
                busy_since = time.monotonic()
            if busy_since is not None and time.monotonic() - busy_since > 2.0:
                break
        assert proc.poll() is None, "the build ended before it could be killed: " + proc.stderr.read()[-2000:]
        before = _published(out)
        assert len(before) < 2, "the build finished its work before the kill"
        procs = _tree(proc.pid)
        procs.pop(proc.pid)
        assert any(_name(p).startswith("raylet") for p in procs), procs
        shm = _shm(procs)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=120)
        return before, procs, shm, (proc.returncode, stderr)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _session_files(dirs: list[Path]) -> list[Path]:
    """What a private cluster left in its directories (``cadenza-ray-*`` temp dirs, ``.work/ray/*``)."""
    tmp, work = dirs
    return [*tmp.glob("cadenza-ray-*"), *(work.iterdir() if work.is_dir() else [])]


def _name(pid: int) -> str:
    try:
        return psutil.Process(pid).name()
    except psutil.Error:
        return ""
