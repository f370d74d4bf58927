"""kill -9 in the middle of a real build, rerun: no duplicate, no half-written task, the set completes."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cadenza.tasks.records.store import TaskStore
from cadenza.tasks.records.task import load_task
from tests.support.tasks_helpers import make_repo, shared_env_cache

pytestmark = [pytest.mark.slow, pytest.mark.network]  # task venvs install their tooling with pip

MAX_TASKS = 3


def _published(out: Path) -> int:
    try:
        with sqlite3.connect(out / "index.sqlite", timeout=30) as con:
            return con.execute("SELECT COUNT(*) FROM tasks").fetchone()[0]
    except sqlite3.Error:
        return 0


def test_sigkill_mid_build_then_resume(tmp_path, tmp_path_factory):
    src = make_repo(tmp_path / "minilib")
    out = tmp_path / "set"
    env = {**os.environ, "CADENZA_ENV_CACHE": str(shared_env_cache(tmp_path_factory))}
    cmd = [
        sys.executable,
        "-m",
        "cadenza",
        "tasks",
        "build",
        str(src),
        "--out",
        str(out),
        "--max-tasks",
        str(MAX_TASKS),
        "--levels",
        "1,2,3",
        "--seed",
        "1",
        "--quiet",
    ]
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.monotonic() + 600
    try:
        while _published(out) < 1 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, "the build finished before it could be killed"
        os.killpg(proc.pid, signal.SIGKILL)  # the build and every pytest it runs, no cleanup handlers
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    before = _published(out)
    assert 1 <= before < MAX_TASKS

    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    store = TaskStore(out)
    rows = store.rows()
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)) == MAX_TASKS
    assert len({(r["qualname"], r["level"]) for r in rows}) == MAX_TASKS
    on_disk = sorted(p.name for p in out.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert on_disk == sorted(ids)
    for tid in ids:  # every task complete
        task = load_task(out / tid)
        assert (out / tid / "gold.patch").read_text().startswith("diff --git")
        assert (out / tid / "env" / "bin" / "python").exists() and task.fail_to_pass and task.pass_to_pass
    assert not any((out / ".staging").iterdir())
    assert not any((out / ".work").iterdir())  # the killed build's copy of the original source is gone
    # a third run has nothing left to do and changes nothing
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and [r["id"] for r in TaskStore(out).rows()] == ids
    assert "resumed" in again.stdout
