"""``cadenza eval --executor ray``: the episodes fan out as units on a private loopback Ray cluster and
give the same results as the local threads, against the same scripted chat-completions server."""

from __future__ import annotations

import json

import pytest

from cadenza.agent.trajectory import Trajectory
from tests.support.chat_server import serve
from tests.support.eval_script import _eval, policy

pytestmark = [pytest.mark.slow, pytest.mark.serial("ray")]

SAME = ("resolved", "reward", "turns", "flags", "error", "stop_reason")


def _summary(out) -> dict[str, dict]:
    return {r["task_id"]: r for r in json.loads((out / "summary.json").read_text())["results"]}


UNTIMED = ("seconds", "log_tail", "phases")


def _untimed(x):
    """``x`` without its timings (``duration_s``, ``seconds``, grading's ``phases``, pytest's "in 0.2s" log:
    they vary run to run)."""
    if isinstance(x, dict):
        return {k: _untimed(v) for k, v in x.items() if not (k.endswith("_s") or k in UNTIMED)}
    return x


def test_eval_on_ray_equals_local(taskset, tmp_path):
    args = ["--model", "scripted", "--concurrency", "2", "--max-turns", "10"]
    with serve(policy) as srv:
        local = _eval(str(taskset), "--endpoint", srv.url, *args, "--out", str(tmp_path / "local"))
        served_local = len(srv.requests)
        ray = _eval(
            str(taskset), "--endpoint", srv.url, *args, "--out", str(tmp_path / "ray"), "--executor", "ray"
        )
    assert local.returncode == 0, local.stderr + local.stdout
    assert ray.returncode == 0, ray.stderr + ray.stdout
    assert len(srv.requests) == 2 * served_local  # the Ray workers really called the server
    want, got = _summary(tmp_path / "local"), _summary(tmp_path / "ray")
    assert sorted(got) == sorted(want) == ["calc-clamp", "calc-other"]
    assert all(want[t]["resolved"] and want[t]["reward"] == 1.0 for t in want)
    for t in want:
        assert {k: got[t][k] for k in SAME} == {k: want[t][k] for k in SAME}, t
        a, b = Trajectory.load(got[t]["trajectory"]), Trajectory.load(want[t]["trajectory"])
        assert [x.tool for x in a.turns] == [x.tool for x in b.turns]
        assert _untimed(a.outcome) == _untimed(b.outcome) and a.outcome["f2p"] == {"passed": 4, "total": 4}
        assert str(tmp_path / "ray") in got[t]["trajectory"]  # written by the worker into --out


def test_eval_ray_address_that_does_not_answer_is_one_line(taskset, tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = _eval(str(taskset), "--endpoint", "http://127.0.0.1:9/v1", "--model", "m", "--out",
                str(tmp_path / "o"), "--executor", "ray", "--ray-address", f"127.0.0.1:{port}")  # fmt: skip
    assert res.returncode == 2 and "does not answer" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "o").exists()
