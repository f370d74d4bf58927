"""``SIGTERM`` to the parent alone (``kill -TERM``, a scheduler, a CI runner) stops the experiment's
worker processes too: none of the processes below the parent keeps computing."""

from __future__ import annotations

import os
import sys

import pytest

from tests.support.proctree import kill_all, sigterm_leaves

pytestmark = pytest.mark.slow


def test_sigterm_of_the_parent_stops_the_workers(tmp_path):
    cmd = [sys.executable, "-m", "cadenza", "experiment", "tool-hints", "--quick", "--seeds", "0,1",
           "--workers", "2", "--out", str(tmp_path / "run")]  # fmt: skip
    before, left, rc = sigterm_leaves(cmd, workers=2, env={**os.environ, "PYTHONPATH": os.getcwd()})
    kill_all(left)
    assert before, "the run had no worker processes"
    assert rc == -15, rc  # the parent ended by the signal, not by a crash
    assert not left, f"{len(left)} of {len(before)} processes below the parent kept running after SIGTERM"
