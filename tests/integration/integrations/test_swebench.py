"""SWE-bench's own code reads cadenza's tasks: exported records load as ``SWEbenchInstance`` with its
loader, and its pytest log parser, fed a ``pytest -rA`` log of the task's own tests, gives the per-test
statuses cadenza's runner gives, on the gold and on the broken workspace of tasks from real packages."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cadenza.agent.grading.grade import grade
from cadenza.integrations.install import ecosystem_env, ecosystem_python
from cadenza.sandbox import Sandbox, SandboxConfig, hidden_roots
from cadenza.tasks.records.task import GOLD_PATCH, WORKSPACE, load_task, task_env_dir
from tests.support.tasks_helpers import REAL_SOURCES, real_taskset

pytestmark = [pytest.mark.slow, pytest.mark.network]

#: SWE-bench's status words -> cadenza's runner outcomes.
STATUS = {"PASSED": "passed", "FAILED": "failed", "ERROR": "error", "SKIPPED": "skipped", "XFAIL": "xfailed"}


@pytest.fixture(scope="module")
def taskset(tmp_path_factory) -> Path:
    """The real task set of the task-build tests (three PyPI packages), built once per run."""
    return real_taskset(tmp_path_factory)[0]


def _swebench(*args: str) -> dict:
    proc = subprocess.run(
        [ecosystem_python(), "-m", "cadenza.integrations.swebench_check", *args],
        capture_output=True, text=True, timeout=300, env=ecosystem_env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_exported_records_load_as_swebench_instances(taskset: Path, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "cadenza", "tasks", "export", str(taskset), "--format", "swebench"],
        capture_output=True, text=True, timeout=300, env=ecosystem_env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (tmp_path / "records.jsonl").write_text(proc.stdout)
    assert _swebench("instances", str(tmp_path / "records.jsonl")) == {
        "checked": len(REAL_SOURCES),
        "problems": {},
    }
    # The check can fail: SWE-bench declares the test lists as JSON strings, not lists.
    rec = json.loads(proc.stdout.splitlines()[0])
    bad = {**rec, "FAIL_TO_PASS": json.loads(rec["FAIL_TO_PASS"])}
    bad.pop("base_commit")
    (tmp_path / "bad.jsonl").write_text(json.dumps(bad) + "\n")
    problems = _swebench("instances", str(tmp_path / "bad.jsonl"))["problems"][rec["instance_id"]]
    assert "missing base_commit" in problems and any(p.startswith("FAIL_TO_PASS is list") for p in problems)


def _workspace(task_dir: Path, dest: Path, *, gold: bool) -> Path:
    ws = dest / WORKSPACE
    shutil.copytree(task_dir / WORKSPACE, ws, symlinks=True)
    if gold:
        subprocess.run(["git", "apply", str(task_dir / GOLD_PATCH)], cwd=ws, check=True, timeout=60)
    return ws


def _pytest_log(task_dir: Path, ws: Path, node_ids: list[str]) -> str:
    """``pytest -rA`` on the task's tests in the sandbox (SWE-bench's test command), the full log."""
    task = load_task(task_dir)
    env = task_env_dir(task_dir, task)
    sandbox = Sandbox(
        ws, env_dir=env, config=SandboxConfig(max_output_bytes=8_000_000), hidden=hidden_roots(task_dir),
        path_map={task_dir / WORKSPACE: ws},
    )  # fmt: skip
    try:
        argv = [
            sandbox.env.python if sandbox.env else "python",
            "-m",
            "pytest",
            "-rA",
            "-p",
            "no:cacheprovider",
        ]
        res = sandbox.run([*argv, *task.pytest_args, *node_ids], timeout_s=600, merge_stderr=True)
    finally:
        sandbox.close()
    return res.output


@pytest.mark.parametrize("gold", [True, False], ids=["gold", "broken"])
def test_swebench_log_parser_agrees_with_cadenzas_runner(taskset: Path, tmp_path: Path, gold: bool) -> None:
    tasks = sorted(p.parent for p in taskset.glob("*/task.json"))
    assert len(tasks) == len(REAL_SOURCES)
    for n, task_dir in enumerate(tasks):
        task = load_task(task_dir)
        node_ids = [*task.fail_to_pass, *task.pass_to_pass]
        ws = _workspace(task_dir, tmp_path / f"{n}-cadenza", gold=gold)
        ours = grade(task_dir, ws, task=task).tests
        log = tmp_path / f"{n}.log"
        log.write_text(
            _pytest_log(task_dir, _workspace(task_dir, tmp_path / f"{n}-swebench", gold=gold), node_ids)
        )
        theirs = _swebench("parse", str(log))
        # A test the log never names (its module failed to import) is a failure in SWE-bench's grading.
        mapped = {t: STATUS.get(theirs.get(t, ""), "absent") for t in node_ids}
        expected = {
            t: ("absent" if ours[t] in ("missing", "error") and t not in theirs else ours[t])
            for t in node_ids
        }
        assert mapped == expected, (task.id, log.read_text()[-3000:])
        if gold:
            assert set(mapped.values()) == {"passed"}
        else:
            assert all(mapped[t] != "passed" for t in task.fail_to_pass)
            assert all(mapped[t] == "passed" for t in task.pass_to_pass)
