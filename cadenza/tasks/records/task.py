"""The task record: one directory per task, ``task.json`` + ``workspace/`` + ``gold.patch``.

This module is the contract between the factory (which writes tasks), the agent environment
(which runs and grades them) and the curriculum (which samples them). Field names follow
SWE-bench where one exists (``fail_to_pass``/``pass_to_pass`` export as ``FAIL_TO_PASS``/...).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from cadenza.errors import CadenzaError
from cadenza.jsonio import atomic_write_json

FeatureKind = Literal["function", "method", "class", "module"]
TASK_JSON = "task.json"
WORKSPACE = "workspace"
GOLD_PATCH = "gold.patch"


@dataclass(kw_only=True)
class Feature:
    """What was deleted: ``qualname`` (e.g. ``pkg.mod.Class.method``), file ``path`` relative to the
    workspace."""

    qualname: str
    path: str
    kind: FeatureKind
    lineno: int | None = None
    end_lineno: int | None = None


@dataclass(kw_only=True)
class Task:
    """A validated re-implementation task.

    ``env`` is the task's Python environment directory (``bin/python`` inside), relative to the
    task directory or absolute. ``test_files`` lists workspace-relative test files and pytest
    configuration the grader restores. ``pytest_args`` are extra arguments every run uses.
    """

    id: str
    source: str
    feature: Feature
    level: int
    statement: str
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    package: str = ""
    env: str = "env"
    test_files: list[str] = field(default_factory=list)
    pytest_args: list[str] = field(default_factory=list)
    test_timeout_s: float = 60.0
    excluded_tests: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Task:
        data = dict(data)
        feature = data.pop("feature", None)
        if not isinstance(feature, dict):
            raise CadenzaError(
                "task.json has no 'feature' object; rebuild the task with 'cadenza tasks build'"
            )
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(data) - known
        if unknown:
            # Forward compatibility: keep unknown keys in meta rather than failing.
            data.setdefault("meta", {}).update({k: data.pop(k) for k in sorted(unknown)})
        missing = [
            k for k in ("id", "source", "level", "statement", "fail_to_pass", "pass_to_pass") if k not in data
        ]
        if missing:
            raise CadenzaError(
                f"task.json lacks {', '.join(missing)}; rebuild the task with 'cadenza tasks build'"
            )
        return cls(feature=Feature(**feature), **data)


def load_task(task_dir: str | Path) -> Task:
    """Read ``task_dir/task.json``; a clear error if the directory is not a task."""
    path = Path(task_dir) / TASK_JSON
    if not path.is_file():
        raise CadenzaError(
            f"{task_dir} is not a task directory (no {TASK_JSON}); pass a directory made by 'cadenza "
            "tasks build'"
        )
    try:
        return Task.from_dict(json.loads(path.read_text()))
    except json.JSONDecodeError as exc:
        raise CadenzaError(
            f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}); rebuild the task"
        ) from None


def save_task(task_dir: str | Path, task: Task) -> None:
    atomic_write_json(Path(task_dir) / TASK_JSON, task.to_dict())


def task_env_dir(task_dir: str | Path, task: Task) -> Path:
    """The task's environment directory (``task.env``, relative to the task directory unless absolute);
    it may not exist: :func:`task_python` is the checked way in."""
    env = Path(task.env)
    return env if env.is_absolute() else Path(task_dir) / env


def task_python(task_dir: str | Path, task: Task | None = None) -> Path:
    """The python executable of the task's environment (one line naming the fix when it is missing)."""
    task = task or load_task(task_dir)
    env = task_env_dir(task_dir, task)
    python = env / "bin" / "python"
    if not python.exists():
        raise CadenzaError(
            f"task {task.id}: environment {env} has no bin/python; rebuild it with 'cadenza tasks verify'"
        )
    return python
