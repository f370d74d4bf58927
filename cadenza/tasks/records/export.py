"""Export a task set as SWE-bench-style records, so other harnesses can consume our tasks."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cadenza.tasks.records.store import TaskStore
from cadenza.tasks.records.task import GOLD_PATCH, WORKSPACE, load_task


def _head(workspace: Path) -> str:
    res = subprocess.run(
        ["git", "-C", str(workspace), "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    return res.stdout.strip() if res.returncode == 0 else ""


def export_swebench(path: Path) -> Iterator[dict[str, Any]]:
    """One ``swebench.types.SWEbenchInstance`` per task, plus cadenza's level and feature."""
    store = TaskStore(path)
    for row in store.rows():
        task_dir = store.task_dir(row["id"])
        task = load_task(task_dir)
        yield {
            "instance_id": task.id,
            "repo": task.source,
            "base_commit": _head(task_dir / WORKSPACE),
            "problem_statement": task.statement,
            "patch": (task_dir / GOLD_PATCH).read_text(),
            "test_patch": "",
            # JSON-encoded lists, as in SWE-bench's datasets and its SWEbenchInstance type
            "FAIL_TO_PASS": json.dumps(list(task.fail_to_pass)),
            "PASS_TO_PASS": json.dumps(list(task.pass_to_pass)),
            "version": str(task.meta.get("source_version", task.meta.get("version", ""))),
            "created_at": row["created"],
            "hints_text": "",
            "environment_setup_commit": "",
            "level": task.level,
            "feature": {
                "qualname": task.feature.qualname,
                "path": task.feature.path,
                "kind": task.feature.kind,
            },
        }
