"""Task discovery and the evaluation driver on tiny environments (no sandbox): concurrency, errors,
summary."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from cadenza.agent.evaluate import EvalConfig, discover_tasks, evaluate
from cadenza.agent.llm import LLMConfig
from cadenza.errors import CadenzaError
from cadenza.tasks.records.task import Feature, Task, save_task
from tests.support.chat_server import scripted, serve, tool_call
from tests.support.llm_helpers import ReachFiveEnv


def make_tasks(root: Path, names: list[str]) -> None:
    for name in names:
        save_task(
            root / name,
            Task(
                id=name,
                source="local:x",
                feature=Feature(qualname="x.f", path="x.py", kind="function"),
                level=1,
                statement="s",
                fail_to_pass=[],
                pass_to_pass=[],
            ),
        )


def test_discover_tasks(tmp_path):
    make_tasks(tmp_path, ["b", "a", "c"])
    (tmp_path / "notes").mkdir()
    assert [p.name for p in discover_tasks(tmp_path)] == ["a", "b", "c"]
    assert discover_tasks(tmp_path / "a") == [tmp_path / "a"]
    con = sqlite3.connect(tmp_path / "index.sqlite")
    con.execute("CREATE TABLE tasks (id TEXT PRIMARY KEY, state TEXT NOT NULL)")
    con.executemany(
        "INSERT INTO tasks VALUES (?, ?)",
        [("c", "ready"), ("a", "ready"), ("b", "retired"), ("gone", "ready")],
    )
    con.commit()
    con.close()
    assert [p.name for p in discover_tasks(tmp_path)] == [
        "a",
        "c",
    ]  # the index decides; missing dirs are skipped
    with pytest.raises(CadenzaError, match="holds no tasks"):
        discover_tasks(tmp_path / "notes")
    with pytest.raises(CadenzaError, match="not a directory"):
        discover_tasks(tmp_path / "missing")


class SlowCounterEnv(ReachFiveEnv):
    active = 0
    peak = 0
    lock = threading.Lock()

    def step(self, call):
        with SlowCounterEnv.lock:
            SlowCounterEnv.active += 1
            SlowCounterEnv.peak = max(SlowCounterEnv.peak, SlowCounterEnv.active)
        time.sleep(0.05)
        with SlowCounterEnv.lock:
            SlowCounterEnv.active -= 1
        return super().step(call)


def test_evaluate_runs_tasks_concurrently_and_survives_broken_ones(tmp_path):
    make_tasks(tmp_path / "set", ["t1", "t2", "t3", "t4", "broken"])

    def make_env(task_dir: Path):
        if task_dir.name == "broken":
            raise RuntimeError("workspace missing")
        return SlowCounterEnv()

    seen = []
    with serve(scripted([tool_call("add", n=5), tool_call("submit")])) as srv:
        cfg = EvalConfig(tasks_dir=tmp_path / "set", out_dir=tmp_path / "out", concurrency=3, max_turns=5,
                         llm=LLMConfig(endpoint=srv.url, model="m", backoff_s=0.01))  # fmt: skip
        report = evaluate(cfg, make_env=make_env, on_result=lambda r: seen.append(r.task_id))
    assert sorted(seen) == ["broken", "t1", "t2", "t3", "t4"]
    assert SlowCounterEnv.peak >= 2  # episodes overlapped
    assert (
        report.resolved_rate == pytest.approx(4 / 5)
        and report.errored == 1
        and report.mean_turns == pytest.approx(8 / 5)
    )
    broken = next(r for r in report.results if r.task_id == "broken")
    assert broken.error == "RuntimeError: workspace missing"
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["tasks"] == 5 and summary["interrupted"] is False
    assert sorted(p.name for p in (tmp_path / "out").glob("t*.json")) == [
        "t1.json",
        "t2.json",
        "t3.json",
        "t4.json",
    ]


def test_eval_config_validation(tmp_path):
    llm = LLMConfig(endpoint="http://127.0.0.1:1/v1", model="m")
    with pytest.raises(CadenzaError, match="concurrency"):
        EvalConfig(tasks_dir=tmp_path, out_dir=tmp_path, llm=llm, concurrency=0)
    with pytest.raises(CadenzaError, match="max-turns"):
        EvalConfig(tasks_dir=tmp_path, out_dir=tmp_path, llm=llm, max_turns=0)
    (tmp_path / "file").write_text("x")
    with pytest.raises(CadenzaError, match="is a file"):
        EvalConfig(tasks_dir=tmp_path, out_dir=tmp_path / "file", llm=llm)


def test_context_overflow_in_eval_is_a_graded_context_exhausted_episode(tmp_path):
    """The served model's HTTP 400 'maximum context length' ends the task as "context", graded, not
    errored."""
    from tests.support.llm_helpers import VLLM_CONTEXT_400

    make_tasks(tmp_path / "set", ["t1"])
    with serve(scripted([tool_call("add", n=5), (400, VLLM_CONTEXT_400)])) as srv:
        cfg = EvalConfig(tasks_dir=tmp_path / "set", out_dir=tmp_path / "out", concurrency=1, max_turns=5,
                         llm=LLMConfig(endpoint=srv.url, model="m", backoff_s=0.01))  # fmt: skip
        report = evaluate(cfg, make_env=lambda _: SlowCounterEnv())
    (res,) = report.results
    assert res.error is None and res.stop_reason == "context" and res.resolved and report.errored == 0
