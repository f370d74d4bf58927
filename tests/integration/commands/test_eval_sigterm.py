"""``SIGTERM`` to ``cadenza eval --concurrency 2`` alone (``kill -TERM``, a scheduler, a CI runner)
stops the episodes' commands too: two sandboxed ``sleep`` calls do not outlive the parent."""

from __future__ import annotations

import os
import sys

from tests.support.chat_server import serve, tool_call
from tests.support.eval_script import ROOT
from tests.support.proctree import kill_all, sigterm_leaves


def _sleeper(body: dict) -> dict:
    return tool_call("bash", command="sleep 57")


def test_sigterm_of_eval_stops_its_episodes(taskset, tmp_path):
    with serve(_sleeper) as srv:
        cmd = [sys.executable, "-m", "cadenza", "eval", str(taskset), "--endpoint", srv.url, "--model", "s",
               "--concurrency", "2", "--max-turns", "3", "--out", str(tmp_path / "out")]  # fmt: skip
        before, left, rc = sigterm_leaves(cmd, workers=2, needle=b"sleep\x0057", cwd=str(ROOT),
                                          env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    kill_all(left)
    assert before and rc == -15, rc
    assert not left, f"{len(left)} of {len(before)} processes below eval kept running after SIGTERM"
