"""Re-validate a published task in clean copies (the core's ``recheck``) and leak-scan it.

The test runs execute inside bubblewrap with the same runner grading uses.

``recheck`` copies the workspace twice (as is, and with ``gold.patch`` applied) and asks for a
python per copy; :func:`clone_env` gives it one by cloning the task's light env and pointing its
relative workspace ``.pth`` entries at the copy. Nothing the tests write lands in the task set.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from cadenza.sandbox import SandboxConfig
from cadenza.tasks.leaks.scan import scan_tasks
from cadenza.tasks.records.task import GOLD_PATCH, WORKSPACE, load_task, task_env_dir


@dataclass(kw_only=True)
class VerifyResult:
    task_id: str
    ok: bool
    reason: str = ""
    f2p: int = 0
    p2p: int = 0
    seconds: float = 0.0


def clone_env(env_dir: Path, workspace: Path, new_workspace: Path, dest: Path) -> Path:
    """Copy a task env to ``dest`` so that it imports from ``new_workspace`` instead of ``workspace``."""
    shutil.copytree(env_dir, dest, symlinks=True)
    old_ws = os.path.realpath(workspace)
    for old_site in Path(env_dir).glob("lib/python*/site-packages"):
        new_site = dest / old_site.relative_to(env_dir)
        for pth in new_site.glob("*.pth"):
            lines = []
            for line in pth.read_text().splitlines():
                target = (
                    os.path.realpath(old_site / line)
                    if line.strip() and not line.startswith(("#", "import"))
                    else ""
                )
                if target == old_ws or target.startswith(old_ws + os.sep):
                    line = os.path.relpath(Path(new_workspace) / os.path.relpath(target, old_ws), new_site)
                lines.append(line)
            pth.write_text("\n".join(lines) + "\n")
    return dest / "bin" / "python"


def verify_task(task_dir: Path) -> VerifyResult:
    """F2P fail and P2P pass on a copy; everything passes on a gold-patched copy; no leak finding."""
    from cadenza.tasks.validation.validate import recheck

    task_dir = Path(task_dir)
    task = load_task(task_dir)
    res = VerifyResult(task_id=task.id, ok=False, f2p=len(task.fail_to_pass), p2p=len(task.pass_to_pass))
    if not task.fail_to_pass or not task.pass_to_pass:
        res.reason = "needs at least one FAIL_TO_PASS and one PASS_TO_PASS test"
        return res
    ws, env = task_dir / WORKSPACE, task_env_dir(task_dir, task)
    if not (env / "bin" / "python").exists():
        res.reason = f"environment {env} has no bin/python; rebuild the task"
        return res
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="cadenza-verify-") as tmp:
        check = recheck(
            workspace=ws,
            gold_patch=(task_dir / GOLD_PATCH).read_text(),
            fail_to_pass=list(task.fail_to_pass),
            pass_to_pass=list(task.pass_to_pass),
            make_python=lambda w, e: clone_env(env, ws, w, e),
            scratch=Path(tmp),
            pytest_args=list(task.pytest_args),
            per_test_timeout_s=task.test_timeout_s,
            sandbox=SandboxConfig(timeout_s=600.0),  # third-party code: in bubblewrap, as at grading
        )
    res.seconds = round(time.monotonic() - t0, 2)
    if not check.ok:
        res.reason = check.reason
        return res
    findings = scan_tasks([task_dir])
    if findings:
        res.reason = f"leak: {findings[0].channel} {findings[0].path}: {findings[0].evidence}"
        return res
    res.ok = True
    return res
