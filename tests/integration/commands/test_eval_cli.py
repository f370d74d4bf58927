"""``cadenza eval`` end to end: real episodes (bubblewrap, real grading, monitor) driven by a local
HTTP server that speaks the chat-completions protocol with scripted replies."""

from __future__ import annotations

import json

from cadenza.agent.trajectory import Trajectory
from cadenza.tasks.records.task import load_task, save_task
from tests.support.chat_server import closed_port_url, serve
from tests.support.eval_script import _eval, policy


def test_eval_runs_model_over_task_set(taskset, tmp_path):
    hack = load_task(taskset / "calc-other")
    hack.statement += " [hack]"
    save_task(taskset / "calc-other", hack)
    out = tmp_path / "out"
    with serve(policy) as srv:
        res = _eval(
            str(taskset),
            "--endpoint",
            srv.url,
            "--model",
            "scripted",
            "--concurrency",
            "2",
            "--max-turns",
            "10",
            "--out",
            str(out),
            "--judge-endpoint",
            srv.url,
            "--judge-model",
            "judge",
        )
    assert res.returncode == 0, res.stderr + res.stdout
    assert (
        "resolved rate" in res.stdout
        and "50.0%" in res.stdout
        and "git_archaeology: 1" in res.stdout
        and "judge_history: 1" in res.stdout
    )
    summary = json.loads((out / "summary.json").read_text())
    assert (
        summary["tasks"] == 2
        and summary["resolved_rate"] == 0.5
        and summary["graded_rate"] == 1.0
        and summary["errored"] == 0
    )
    assert summary["flags_per_rule"] == {"git_archaeology": 1, "judge_history": 1}
    by_id = {r["task_id"]: r for r in summary["results"]}
    assert by_id["calc-clamp"]["resolved"] and by_id["calc-clamp"]["reward"] == 1.0
    assert by_id["calc-other"]["reward"] == 0.0 and by_id["calc-other"]["flags"] == [
        "git_archaeology",
        "judge_history",
    ]
    traj = Trajectory.load(by_id["calc-clamp"]["trajectory"])
    assert [t.tool for t in traj.turns] == ["view", "str_replace", "run_tests", "submit"]
    assert traj.outcome["f2p"] == {"passed": 4, "total": 4} and traj.meta["usage"]["completion_tokens"] == 20
    assert (
        len(srv.requests) == 4 + 5 + 2
    )  # one request per assistant turn and one judge call per task, no retries


def test_eval_with_endpoint_down_or_garbage_reports_errored_tasks(taskset, tmp_path):
    res = _eval(
        str(taskset),
        "--endpoint",
        closed_port_url(),
        "--model",
        "m",
        "--retries",
        "0",
        "--out",
        str(tmp_path / "a"),
    )
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "every episode failed" in res.stderr and "unreachable" in res.stderr
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["errored"] == 2 and summary["resolved_rate"] == 0.0
    with serve(lambda body: (200, b"<html>proxy error</html>")) as srv:
        res = _eval(
            str(taskset / "calc-clamp"),
            "--endpoint",
            srv.url,
            "--model",
            "m",
            "--retries",
            "0",
            "--out",
            str(tmp_path / "b"),
        )
    assert res.returncode == 1 and "did not return JSON" in res.stderr


def test_eval_bad_input_is_one_line(tmp_path):
    res = _eval(str(tmp_path), "--endpoint", "http://127.0.0.1:9/v1", "--model", "m")
    assert res.returncode == 2 and res.stderr.startswith("error: ") and "holds no tasks" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    res = _eval(str(tmp_path), "--endpoint", "localhost:8000", "--model", "m")
    assert res.returncode == 2 and "not an http(s) URL" in res.stderr
