"""SWE-bench's own code reads cadenza's tasks: exported records load as ``SWEbenchInstance`` with its
loader, and its pytest log parser, fed a ``pytest -rA`` log of the task's own tests, gives the per-test
statuses cadenza's runner gives, on the gold and on the broken workspace of tasks from real packages.

The same workspaces check that the factory's runs (host, as in validation and ``verify``) and grading
(sandbox) are one runner: they give the same outcome for every node ID, on the broken and the fixed tree
(one grade per workspace serves both comparisons)."""

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
from cadenza.tasks.sources.runner import run_pytest
from cadenza.tasks.validation.verify import clone_env
from tests.support.tasks_helpers import REAL_SOURCES, real_taskset

pytestmark = [pytest.mark.slow, pytest.mark.network]

#: SWE-bench's status words -> cadenza's runner outcomes.
STATUS = {"PASSED": "passed", "FAILED": "failed", "ERROR": "error", "SKIPPED": "skipped", "XFAIL": "xfailed"}


@pytest.fixture(scope="module")
def taskset(tmp_path_factory) -> Path:
    """The real task set of the task-build tests (three PyPI packages), built once per run."""
    return real_taskset(tmp_path_factory)[0]


def _swebench(what: str, *files: Path) -> list[dict]:
    """SWE-bench's answer for each of ``files``, from one start of the ecosystem interpreter."""
    proc = subprocess.run(
        [ecosystem_python(), "-m", "cadenza.integrations.swebench_check", what, *map(str, files)],
        capture_output=True, text=True, timeout=300, env=ecosystem_env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(out) == len(files), proc.stdout[-3000:]
    return out


def test_exported_records_load_as_swebench_instances(taskset: Path, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "cadenza", "tasks", "export", str(taskset), "--format", "swebench"],
        capture_output=True, text=True, timeout=300, env=ecosystem_env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (tmp_path / "records.jsonl").write_text(proc.stdout)
    # The check can fail: SWE-bench declares the test lists as JSON strings, not lists.
    rec = json.loads(proc.stdout.splitlines()[0])
    bad = {**rec, "FAIL_TO_PASS": json.loads(rec["FAIL_TO_PASS"])}
    bad.pop("base_commit")
    (tmp_path / "bad.jsonl").write_text(json.dumps(bad) + "\n")
    good, wrong = _swebench("instances", tmp_path / "records.jsonl", tmp_path / "bad.jsonl")
    assert good == {"checked": len(REAL_SOURCES), "problems": {}}
    problems = wrong["problems"][rec["instance_id"]]
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


def test_swebench_log_parser_agrees_with_cadenzas_runner(taskset: Path, tmp_path: Path) -> None:
    """On the gold and on the broken workspace of every task (one parser start for all six logs); on each,
    cadenza's host runner and its grading agree first."""
    tasks = sorted(p.parent for p in taskset.glob("*/task.json"))
    assert len(tasks) == len(REAL_SOURCES)
    runs = []  # (task, gold, cadenza's statuses, the log)
    for gold in (True, False):
        for n, task_dir in enumerate(tasks):
            task = load_task(task_dir)
            node_ids = [*task.fail_to_pass, *task.pass_to_pass]
            where = tmp_path / ("gold" if gold else "broken")
            ws = _workspace(task_dir, where / f"{n}-cadenza", gold=gold)
            python = clone_env(task_env_dir(task_dir, task), task_dir / WORKSPACE, ws, where / f"{n}-env")
            host = run_pytest(
                python,
                ws,
                node_ids,
                extra_args=list(task.pytest_args),
                per_test_timeout_s=task.test_timeout_s,
            ).statuses(node_ids)
            graded = grade(task_dir, ws, task=task)
            ours = graded.tests
            assert ours == host, (task.id, gold)  # the host runner and grading agree node by node
            assert not graded.tampering and graded.resolved is gold, (task.id, gold)
            passing = task.pass_to_pass if not gold else node_ids
            assert {t for t, st in host.items() if st == "passed"} == set(passing), (task.id, gold)
            log = where / f"{n}.log"
            log.write_text(
                _pytest_log(task_dir, _workspace(task_dir, where / f"{n}-swebench", gold=gold), node_ids)
            )
            runs.append((task, gold, ours, log))
    for (task, gold, ours, log), theirs in zip(runs, _swebench("parse", *(r[3] for r in runs)), strict=True):
        node_ids = [*task.fail_to_pass, *task.pass_to_pass]
        # A test the log never names (its module failed to import) is a failure in SWE-bench's grading.
        mapped = {t: STATUS.get(theirs.get(t, ""), "absent") for t in node_ids}
        expected = {
            t: ("absent" if ours[t] in ("missing", "error") and t not in theirs else ours[t])
            for t in node_ids
        }
        assert mapped == expected, (task.id, gold, log.read_text()[-3000:])
        if gold:
            assert set(mapped.values()) == {"passed"}, task.id
        else:
            assert all(mapped[t] != "passed" for t in task.fail_to_pass), task.id
            assert all(mapped[t] == "passed" for t in task.pass_to_pass), task.id
