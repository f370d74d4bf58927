"""Re-validate a published task in a clean copy: the check a grader's trust rests on.

The task dir (workspace + light env, which finds its workspace through a relative path) is copied
to a temp dir, so nothing the tests write lands in the set. In the copy: every FAIL_TO_PASS test
must fail and every PASS_TO_PASS test pass; after ``git apply gold.patch`` every one of them must
pass (a test missing from a report counts as failed). Then the task is leak-scanned.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cadenza.tasks.scan import scan_tasks
from cadenza.tasks.task import GOLD_PATCH, WORKSPACE, load_task, task_python


@dataclass(kw_only=True)
class VerifyResult:
    task_id: str
    ok: bool
    reason: str = ""
    f2p: int = 0
    p2p: int = 0
    seconds: float = 0.0


def _ignore_caches(_d: str, names: list[str]) -> set[str]:
    return {n for n in names if n in ("__pycache__", ".pytest_cache")}


def verify_task(task_dir: Path) -> VerifyResult:
    """Re-run the task's tests before and after the gold patch, in a throwaway copy."""
    from cadenza.tasks.runner import run_pytest

    task_dir = Path(task_dir)
    task = load_task(task_dir)
    res = VerifyResult(task_id=task.id, ok=False, f2p=len(task.fail_to_pass), p2p=len(task.pass_to_pass))
    if not task.fail_to_pass or not task.pass_to_pass:
        res.reason = "needs at least one FAIL_TO_PASS and one PASS_TO_PASS test"
        return res
    with tempfile.TemporaryDirectory(prefix=f"cadenza-verify-{task.id}-") as tmp:
        copy = Path(tmp) / "task"
        shutil.copytree(task_dir, copy, symlinks=True, ignore=_ignore_caches)
        python = task_python(copy, task)
        ws = copy / WORKSPACE
        ids = list(task.fail_to_pass) + list(task.pass_to_pass)
        kwargs = {"per_test_timeout_s": task.test_timeout_s, "extra_args": list(task.pytest_args)}
        before = run_pytest(python, ws, ids, **kwargs)
        res.seconds += before.duration_s
        passing_f2p = [t for t in task.fail_to_pass if before.passed(t)]
        failing_p2p = [t for t in task.pass_to_pass if not before.passed(t)]
        if passing_f2p:
            res.reason = f"FAIL_TO_PASS test passes without the feature: {passing_f2p[0]}"
            return res
        if failing_p2p:
            res.reason = f"PASS_TO_PASS test fails before the patch: {failing_p2p[0]} ({before.outcome(failing_p2p[0])})"
            return res
        applied = subprocess.run(["git", "apply", "--whitespace=nowarn", str(copy / GOLD_PATCH)], cwd=ws,
                                 capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if applied.returncode != 0:
            res.reason = f"gold.patch does not apply: {applied.stderr.strip().splitlines()[0] if applied.stderr.strip() else 'git apply failed'}"
            return res
        after = run_pytest(python, ws, ids, **kwargs)
        res.seconds += after.duration_s
        failing = [t for t in ids if not after.passed(t)]
        if failing:
            res.reason = f"with the gold patch {failing[0]} does not pass ({after.outcome(failing[0])})"
            return res
    findings = scan_tasks([task_dir])
    if findings:
        res.reason = f"leak: {findings[0].channel} {findings[0].path}: {findings[0].evidence}"
        return res
    res.ok = True
    res.seconds = round(res.seconds, 2)
    return res
