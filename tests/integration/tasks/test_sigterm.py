"""``SIGTERM`` to ``cadenza tasks build`` alone (``kill -TERM``, a scheduler, a CI runner) stops its
worker processes and everything they started (venv installs, pytest runs): nothing below the parent
keeps running."""

from __future__ import annotations

import os
import sys

import pytest

from tests.support.proctree import kill_all, sigterm_leaves
from tests.support.tasks_helpers import make_repo, shared_env_cache

pytestmark = [pytest.mark.slow, pytest.mark.network]  # task venvs install their tooling with pip


def test_sigterm_of_a_build_stops_its_workers(tmp_path, tmp_path_factory):
    env = {**os.environ, "CADENZA_ENV_CACHE": str(shared_env_cache(tmp_path_factory)),
           "PYTHONPATH": os.getcwd()}  # fmt: skip
    srcs = [make_repo(tmp_path / "a"), make_repo(tmp_path / "b", layout="src")]
    cmd = [sys.executable, "-m", "cadenza", "tasks", "build", *map(str, srcs), "--out", str(tmp_path / "out"),
           "--workers", "2", "--max-tasks", "4", "--seed", "1", "--quiet"]  # fmt: skip
    before, left, rc = sigterm_leaves(cmd, workers=2, env=env)
    kill_all(left)
    assert before and rc == -15, rc
    assert not left, f"{len(left)} of {len(before)} processes below the build kept running after SIGTERM"
