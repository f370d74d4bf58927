"""Hardened grading: the agent's source changes, on a fresh copy, against restored tests.

1. Compare the agent's workspace with the pristine task workspace file by file (never its ``.git``).
2. Keep changes to non-test source files; drop tests, ``conftest.py``, pytest configuration, start-up
   hooks (``.pth``, ``sitecustomize.py``, ``usercustomize.py``), packaging metadata (``*.dist-info``,
   ``*.egg-info``, ``entry_points.txt``), symlinks and shadowing modules. ``pyproject.toml`` keeps the
   agent's edits except its ``[tool.pytest...]`` tables.
3. Apply the kept changes to a fresh copy of the pristine workspace (so every test file and config is
   the original) and run the F2P + P2P node IDs inside a fresh one-shot sandbox with the one test
   runner (:mod:`cadenza.testrun`): autoload off, only our plugin and the environment's own plugins,
   the task's ``pytest_args`` as in validation. The environment is bound read-only.
4. Per-node outcomes come only from the verified result channel; a node ID that is not reported counts
   as failed, and any tampering evidence (a forged record, an unknown or duplicated node, a patched
   runner, a rewritten report, an exit before the final record) fails the grade and is reported in
   ``GradeResult.tampering`` so the episode flags it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import tomllib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

import tomli_w

from cadenza.agent.diff import compare
from cadenza.agent.grade_policy import Defences, GradePolicy, top_level_modules
from cadenza.errors import CadenzaError
from cadenza.sandbox import Sandbox, SandboxConfig, env_info, hidden_roots
from cadenza.tasks.records.task import WORKSPACE, Task, load_task, task_python
from cadenza.testrun import SandboxExecutor, env_plugins, run_tests


@dataclass(kw_only=True)
class GradeResult:
    resolved: bool
    f2p_passed: int
    f2p_total: int
    p2p_passed: int
    p2p_total: int
    duration_s: float
    tests: dict[str, str] = field(default_factory=dict)  # node id -> passed/failed/error/skipped/missing
    applied: list[str] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)  # path -> reason
    exit_code: int | None = None
    timed_out: bool = False
    log_tail: str = ""
    sandboxed: bool = True
    tampering: list[str] = field(default_factory=list)  # evidence that the verdict was interfered with

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def task_env_dir(task_dir: Path, task: Task) -> Path:
    return task_python(task_dir, task).parent.parent


def grade(
    task_dir: str | os.PathLike[str],
    agent_workspace: str | os.PathLike[str],
    *,
    task: Task | None = None,
    sandbox: SandboxConfig | None = None,
    run_timeout_s: float | None = None,
    defences: Defences | None = None,
) -> GradeResult:
    """Grade ``agent_workspace`` against the task in ``task_dir`` (see module docstring).

    ``task.test_timeout_s`` bounds each test (with pytest-timeout, when the env has it); the whole run
    is bounded by ``run_timeout_s`` (default: 600 s or the per-test limit, whichever is larger).
    ``defences`` exists for the mutation tests; graders leave it at its default (all on).
    """
    defences = defences or Defences()
    start = time.monotonic()
    task_dir = Path(task_dir).absolute()
    task = task or load_task(task_dir)
    pristine = task_dir / WORKSPACE
    agent = Path(agent_workspace)
    if not agent.is_dir():
        raise CadenzaError(f"agent workspace {agent} does not exist")
    env = task_env_dir(task_dir, task)
    info = env_info(env)
    policy = GradePolicy.for_task(
        task, shadowable=info.importable_names(), pristine_top=top_level_modules(pristine), defences=defences
    )
    with tempfile.TemporaryDirectory(prefix="cadenza-grade-") as tmp:
        work = Path(tmp) / "workspace"
        results = Path(tmp) / "results"
        results.mkdir()
        shutil.copytree(pristine, work, symlinks=True)
        applied, dropped = apply_changes(pristine, agent, work, policy)
        # one command per grade: a fresh per-call bubblewrap, never an episode's long-lived instance
        one_shot = replace(sandbox or SandboxConfig(), persistent=False)
        box = Sandbox(
            work,
            env_dir=env,
            config=one_shot,
            hidden=hidden_roots(task_dir),
            path_map={pristine: work},
            rw_extra=[results],
        )
        nodeids = [*task.fail_to_pass, *task.pass_to_pass]
        timeout = run_timeout_s if run_timeout_s is not None else max(600.0, task.test_timeout_s)
        try:
            report = run_tests(
                python=info.python,
                workspace=work,
                node_ids=nodeids,
                executor=SandboxExecutor(box),
                channel_dir=results,
                plugins=env_plugins(info.sys_path, [pristine, work]),
                extra_args=list(task.pytest_args),
                pythonpath=box.plan.pythonpath,
                timeout_s=timeout,
                per_test_timeout_s=task.test_timeout_s,
                checks=defences.checks,
                autoload_off=defences.autoload_off,
                clear_addopts=defences.clear_addopts,
            )
        finally:
            box.close()
        statuses = report.statuses(nodeids)
    f2p = sum(statuses[n] == "passed" for n in task.fail_to_pass)
    p2p = sum(statuses[n] == "passed" for n in task.pass_to_pass)
    all_pass = f2p == len(task.fail_to_pass) and p2p == len(task.pass_to_pass)
    return GradeResult(
        resolved=all_pass and report.exit_code == 0 and not report.timed_out and bool(nodeids),
        f2p_passed=f2p,
        f2p_total=len(task.fail_to_pass),
        p2p_passed=p2p,
        p2p_total=len(task.pass_to_pass),
        duration_s=time.monotonic() - start,
        tests=statuses,
        applied=applied,
        dropped=dropped,
        exit_code=report.exit_code,
        timed_out=report.timed_out,
        log_tail=report.output_tail,
        sandboxed=box.sandboxed,
        tampering=list(report.tampering),
    )


def apply_changes(
    pristine: Path, agent: Path, dest: Path, policy: GradePolicy
) -> tuple[list[str], dict[str, str]]:
    """Apply the agent's kept changes to ``dest`` (a fresh copy of ``pristine``)."""
    changes = compare(pristine, agent, ignore_bytecode=policy.defences.drop_bytecode)
    applied: list[str] = []
    dropped: dict[str, str] = {}
    agent_kinds = {rel: _kind(agent / rel) for rel in changes.added + changes.modified}
    for rel in changes.deleted:
        reason = policy.reason_to_drop(rel, "file")
        if (
            reason is None
            and PurePosixPath(rel).name == "pyproject.toml"
            and policy.defences.drop_pytest_config
        ):
            reason = "pyproject.toml (it may hold pytest configuration)"
        if reason is not None:
            dropped[rel] = f"deletion of {reason}"
            continue
        target = dest / rel
        if target.is_symlink() or target.is_file():
            target.unlink()
            applied.append(rel)
    for rel in changes.added + changes.modified:
        kind = agent_kinds[rel]
        reason = policy.reason_to_drop(rel, kind)
        if reason is not None:
            dropped[rel] = reason
            continue
        source: Path | bytes | None = agent / rel
        if PurePosixPath(rel).name == "pyproject.toml" and policy.defences.drop_pytest_config:
            source = _merge_pyproject(pristine / rel, agent / rel)
            if source is None:
                dropped[rel] = "pyproject.toml does not parse"
                continue
        if not _copy_inside(dest, rel, source):
            dropped[rel] = "path collides with a restored file or leaves the workspace"
            continue
        applied.append(rel)
    return applied, dropped


def _kind(path: Path) -> str:
    if path.is_symlink():
        return "link"
    return "file" if path.is_file() else "other"


def _copy_inside(root: Path, rel: str, source: Path | bytes) -> bool:
    """Write ``root/rel`` from a regular file (never followed if it is a symlink) or bytes; refuse when a
    parent is a file or a symlink, because the write could then land outside ``root``."""
    target = root / rel
    real_root = Path(os.path.realpath(root))
    probe = target.parent
    while not probe.exists() and probe != root:
        probe = probe.parent
    if Path(os.path.realpath(probe)) != real_root / probe.relative_to(root) or not probe.is_dir():
        return False
    if target.is_symlink() or target.is_dir():
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(source, bytes):
        target.write_bytes(source)
        return True
    fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as src, open(target, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    return True


def _merge_pyproject(pristine: Path, agent: Path) -> bytes | None:
    """The agent's pyproject.toml with the pristine ``[tool.pytest*]`` tables put back."""
    try:
        mine = tomllib.loads(agent.read_text(encoding="utf-8"))
        orig = tomllib.loads(pristine.read_text(encoding="utf-8")) if pristine.is_file() else {}
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError):
        return None
    tool = mine.setdefault("tool", {})
    for key in [k for k in tool if k.startswith("pytest")]:
        del tool[key]
    for key, value in orig.get("tool", {}).items():
        if key.startswith("pytest"):
            tool[key] = value
    if not tool:
        del mine["tool"]
    return tomli_w.dumps(mine).encode("utf-8")
