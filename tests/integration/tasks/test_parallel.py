"""Candidate-level parallelism and resume on a real project (real venvs, real pytest).

``--workers 2`` on ONE source must publish exactly the tasks ``--workers 1`` publishes (same seed,
same ``--max-tasks``), also when it gets there in two runs; a finished build rerun tries nothing.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from cadenza.tasks.builder.factory import split_workers
from tests.support.tasks_helpers import make_repo, shared_env_cache

pytestmark = pytest.mark.slow

SEED = "1"


def _build(
    src: Path, out: Path, workers: int, max_tasks: int, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable,
        "-m",
        "cadenza",
        "tasks",
        "build",
        str(src),
        "--out",
        str(out),
        "--workers",
        str(workers),
        "--max-tasks",
        str(max_tasks),
        "--seed",
        SEED,
        "--quiet",
    ]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    return res


def _ids(out: Path) -> set[str]:
    with sqlite3.connect(out / "index.sqlite") as con:
        return {r[0] for r in con.execute("SELECT id FROM tasks")}


def _last_report(out: Path) -> dict:
    with sqlite3.connect(out / "index.sqlite") as con:
        con.row_factory = sqlite3.Row
        return dict(
            con.execute(
                "SELECT * FROM build_sources WHERE build_id = (SELECT MAX(id) FROM builds)"
            ).fetchone()
        )


@pytest.mark.network  # task venvs install their tooling with pip
def test_two_workers_same_tasks_as_one_and_resume_skips(tmp_path, tmp_path_factory):
    env = {**os.environ, "CADENZA_ENV_CACHE": str(shared_env_cache(tmp_path_factory))}
    src = make_repo(tmp_path / "minilib")

    one = tmp_path / "one"
    _build(src, one, 1, 3, env)
    want = _ids(one)
    assert len(want) == 3

    two = tmp_path / "two"
    _build(src, two, 2, 2, env)  # stops early, as an interrupted build would
    first = _ids(two)
    assert len(first) == 2 and first < want  # the same candidate order, cut at two
    _build(src, two, 2, 3, env)  # tops up: what the set holds is skipped before any test runs
    assert _ids(two) == want
    rep = _last_report(two)
    assert rep["skipped"] == 2 and rep["emitted"] == 1 and rep["validated"] == 1, rep
    assert not any((two / ".work").iterdir()) and not any((two / ".staging").iterdir())

    again = _build(src, two, 2, 3, env)  # finished: nothing to validate
    rep = _last_report(two)
    assert rep["candidates"] == 0 and rep["validated"] == 0 and rep["emitted"] == 0, rep
    assert "resumed" in again.stdout and _ids(two) == want


@pytest.mark.parametrize(
    ("workers", "sources", "want"),
    [
        (1, 3, [1]),
        (2, 1, [2]),
        (2, 3, [1, 1]),
        (3, 2, [2, 1]),
        (8, 3, [3, 3, 2]),
    ],
)
def test_split_workers_uses_every_worker(workers, sources, want):
    assert split_workers(workers, sources) == want and sum(want) == workers
