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

import contextlib
import os
import shutil
import tempfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

import tomli_w

from cadenza.agent.grading.beside import Beside, Phases
from cadenza.agent.grading.capabilities import (
    capability_findings,
    guard_allowances,
    planted_bytecode,
    workspace_files,
)
from cadenza.agent.grading.diff import Changes, compare
from cadenza.agent.grading.policy import Defences, GradePolicy, top_level_modules
from cadenza.errors import CadenzaError
from cadenza.sandbox import Sandbox, SandboxConfig, env_info, hidden_roots
from cadenza.tasks.records.task import WORKSPACE, Task, load_task, task_python
from cadenza.testrun import SandboxExecutor, TestReport, env_plugins, run_tests


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
    capabilities: list[str] = field(default_factory=list)  # process-level capabilities the change brought in
    phases: dict[str, float] = field(default_factory=dict)  # wall seconds per phase (beside.Phases)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
    clock = Phases()
    task_dir = Path(task_dir).absolute()
    task = task or load_task(task_dir)
    pristine = task_dir / WORKSPACE
    agent = Path(agent_workspace)
    if not agent.is_dir():
        raise CadenzaError(f"agent workspace {agent} does not exist")
    env = task_python(task_dir, task).parent.parent  # checked: one line when the env is missing
    info = env_info(env)
    policy = GradePolicy.for_task(
        task,
        shadowable=info.importable_names(),
        pristine_top=top_level_modules(pristine),
        pristine_files=frozenset(workspace_files(pristine)),
        defences=defences,
    )
    clock.mark("prep")
    with tempfile.TemporaryDirectory(prefix="cadenza-grade-") as tmp:
        work = Path(tmp) / "workspace"
        shutil.copytree(pristine, work, symlinks=True)
        changes = compare(pristine, agent, ignore_bytecode=policy.defences.drop_bytecode)
        applied, dropped = apply_changes(pristine, agent, work, policy, changes=changes)
        nodeids = [*task.fail_to_pass, *task.pass_to_pass]
        clock.mark("copy")
        findings = (
            capability_findings(pristine, work, applied, policy) + planted_bytecode(agent)
            if defences.capability_check
            else []
        )
        clock.mark("capability")
        if findings:  # decided here, before any of the change runs: nothing to gain from running it
            report = TestReport(
                outcomes={}, requested=nodeids, exit_code=-1, timed_out=False, duration_s=0.0, complete=False
            )
            statuses = dict.fromkeys(nodeids, "blocked")
            sandboxed = True
        else:
            run = _Runner(task_dir, task, info, env, pristine, work, Path(tmp), sandbox, policy)
            clock.mark("run_setup")
            timeout = run_timeout_s if run_timeout_s is not None else max(600.0, task.test_timeout_s)
            alone_run = None
            if defences.f2p_rerun and task.fail_to_pass:
                # the F2P ids again, alone, in reverse order, in a fresh process over its own copy (the
                # same name: a root package keeps it), beside the main run: neither sandbox sees the
                # other's copy, so no run can leave anything for the other; a failing main run stops it.
                # Its copy is made on its own thread (from the pristine files and the changes already
                # compared, never from the main copy, which the main run may be writing)
                alone_ws = Path(tmp) / "alone" / "workspace"

                def alone(stop: Callable[[], str | None]) -> tuple[TestReport, bool]:
                    shutil.copytree(pristine, alone_ws, symlinks=True)
                    apply_changes(pristine, agent, alone_ws, policy, changes=changes)
                    return run(list(task.fail_to_pass), timeout, True, alone_ws, stop)

                alone_run = Beside(alone)
            try:
                report, sandboxed = run(nodeids, timeout)
            except BaseException:
                if alone_run is not None:  # never leave it running over a copy about to be removed
                    with contextlib.suppress(BaseException):
                        alone_run.result(stop=True)
                raise
            clock.mark("main_run")
            statuses = report.statuses(nodeids)
            f2p_ok = bool(task.fail_to_pass) and all(statuses[n] == "passed" for n in task.fail_to_pass)
            if alone_run is not None:
                alone = alone_run.result(stop=not f2p_ok)  # only a run that passes needs the second look
                clock.mark("join")
                clock.phases["alone_run"] = alone_run.duration_s
                differ = [n for n in task.fail_to_pass if alone.outcome(n) != "passed"] if f2p_ok else []
                if differ:
                    report.tampering.append(
                        f"{len(differ)} fail-to-pass test(s) did not pass when run alone, in reverse"
                        " order, in a fresh process"
                        f" ({differ[0]}: {alone.outcome(differ[0])}): the outcome depends on the run"
                    )
                    report.tampering.extend(t for t in alone.tampering if t not in report.tampering)
                    statuses = report.statuses(nodeids)
            clock.phases.update(run.timings)
    clock.mark("cleanup")
    f2p = sum(statuses[n] == "passed" for n in task.fail_to_pass)
    p2p = sum(statuses[n] == "passed" for n in task.pass_to_pass)
    all_pass = f2p == len(task.fail_to_pass) and p2p == len(task.pass_to_pass)
    return GradeResult(
        resolved=all_pass and report.exit_code == 0 and not report.timed_out and bool(nodeids),
        f2p_passed=f2p,
        f2p_total=len(task.fail_to_pass),
        p2p_passed=p2p,
        p2p_total=len(task.pass_to_pass),
        duration_s=clock.total(),
        phases=clock.rounded(),
        tests=statuses,
        applied=applied,
        dropped=dropped,
        exit_code=report.exit_code,
        timed_out=report.timed_out,
        log_tail=report.output_tail,
        sandboxed=sandboxed,
        tampering=list(report.tampering),
        capabilities=[str(f) for f in findings],
    )


class _Runner:
    """Runs node ids in a fresh one-shot sandbox over a graded copy, each call with its own channel.

    What both runs share is worked out once, here, before either starts: the environment's plugins and
    the guard's allowances (both copies hold the same files, so the same relative paths)."""

    def __init__(self, task_dir, task, info, env, pristine, work, tmp, sandbox, policy) -> None:
        self.task_dir, self.task, self.info, self.env = task_dir, task, info, env
        self.pristine, self.work, self.tmp, self.sandbox, self.policy = pristine, work, tmp, sandbox, policy
        self.plugins = _env_plugins(info.sys_path, (pristine, work))
        self.allow = guard_allowances(pristine, work, policy) if policy.defences.checks.guard else None
        self.timings: dict[str, float] = {}  # "main_sandbox", "main_exec", ... seconds

    def __call__(
        self,
        nodeids: list[str],
        timeout: float,
        reverse: bool = False,
        work: Path | None = None,
        stop: Callable[[], str | None] | None = None,
    ) -> tuple[TestReport, bool]:
        work = work or self.work
        name = "alone" if reverse else "main"
        start = time.monotonic()
        results = self.tmp / f"results-{name}-{len(nodeids)}"
        results.mkdir()
        # one command per run: a fresh per-call bubblewrap, never an episode's long-lived instance
        one_shot = replace(self.sandbox or SandboxConfig(), persistent=False)
        box = Sandbox(
            work,
            env_dir=self.env,
            config=one_shot,
            hidden=hidden_roots(self.task_dir),
            path_map={self.pristine: work},
            rw_extra=[results],
            single_call=True,
        )
        d = self.policy.defences
        self.timings[f"{name}_sandbox"] = round(time.monotonic() - start, 3)
        try:
            report = run_tests(
                python=self.info.python,
                workspace=work,
                node_ids=nodeids,
                executor=SandboxExecutor(box, stop),
                channel_dir=results,
                plugins=list(self.plugins),
                extra_args=list(self.task.pytest_args),
                pythonpath=box.plan.pythonpath,
                timeout_s=timeout,
                per_test_timeout_s=self.task.test_timeout_s,
                checks=d.checks,
                autoload_off=d.autoload_off,
                clear_addopts=d.clear_addopts,
                test_paths=sorted(self.policy.test_paths),
                allow=self.allow,
                reverse=reverse,
            )
        finally:
            box.close()
        self.timings[f"{name}_exec"] = round(report.duration_s, 3)
        return report, box.sandboxed


_PLUGIN_CACHE: dict[tuple, list[str]] = {}


def _env_plugins(sys_path: tuple[str, ...] | list[str], exclude: tuple[Path, ...]) -> list[str]:
    """:func:`env_plugins`, cached per environment state: the same directories, none changed since (a
    directory's mtime moves when a distribution is installed or removed in it). The workspaces are
    left out before the key is made, so their (fresh per grade) paths never miss the cache."""
    roots = [os.path.realpath(p) for p in exclude]
    path = [p for p in sys_path if os.path.isdir(p) and not _under(os.path.realpath(p), roots)]
    key = tuple((p, os.stat(p).st_mtime_ns) for p in path)
    if key not in _PLUGIN_CACHE:
        _PLUGIN_CACHE[key] = env_plugins(path, list(exclude))
    return list(_PLUGIN_CACHE[key])


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def apply_changes(
    pristine: Path, agent: Path, dest: Path, policy: GradePolicy, *, changes: Changes | None = None
) -> tuple[list[str], dict[str, str]]:
    """Apply the agent's kept changes to ``dest`` (a fresh copy of ``pristine``); ``changes``: the
    comparison of the two, when the caller has made it already."""
    if changes is None:
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
