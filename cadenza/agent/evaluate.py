"""Evaluate a model over a task set: one agent episode per task, in a thread pool, trajectories saved.

Each worker thread owns its episode (own workspace copy, own sandboxed processes); the only shared
object is the chat client, which holds no mutable state. Results stream to ``--out`` as they
finish (one trajectory JSON per task, then ``summary.json``), so an interrupted run keeps what it did.
"""

from __future__ import annotations

import sqlite3
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cadenza.agent.env import Env
from cadenza.agent.llm import ChatClient, LLMConfig
from cadenza.agent.loop import NO_TOOL_CALL_RULES, LoopConfig, run_agent
from cadenza.agent.outcome import Outcome
from cadenza.agent.trajectory import Trajectory
from cadenza.errors import CadenzaError
from cadenza.jsonio import atomic_write_json
from cadenza.tasks.records.task import TASK_JSON, load_task

INDEX = "index.sqlite"


@dataclass(kw_only=True)
class EvalConfig:
    tasks_dir: Path
    llm: LLMConfig
    out_dir: Path
    concurrency: int = 4
    max_turns: int = 30
    no_tool_call: str = "nudge"  # a turn without a tool call: nudge (answer it, go on) | end (final answer)
    no_sandbox: bool = False
    judge: Any = None  # cadenza.monitor.JudgeConfig: an LLM judge adding monitor flags
    executor: Any = None  # cadenza.executor.ExecutorConfig; None or local: threads in this process

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise CadenzaError(f"--concurrency must be at least 1, got {self.concurrency}")
        if self.max_turns < 1:
            raise CadenzaError(f"--max-turns must be at least 1, got {self.max_turns}")
        if self.no_tool_call not in NO_TOOL_CALL_RULES:
            raise CadenzaError(
                f"--no-tool-call must be one of {', '.join(NO_TOOL_CALL_RULES)}, got {self.no_tool_call!r}"
            )
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise CadenzaError(
                f"--out {self.out_dir} is a file; pass a directory for trajectories and summary.json"
            )


@dataclass(kw_only=True)
class TaskResult:
    task_id: str
    resolved: bool = False
    reward: float = 0.0
    turns: int = 0
    flags: list[str] = field(default_factory=list)  # rule names
    seconds: float = 0.0
    error: str | None = None
    trajectory: str | None = None  # path of the saved trajectory
    stop_reason: str | None = None  # e.g. "context": the conversation outgrew the server's context window


@dataclass(kw_only=True)
class EvalReport:
    results: list[TaskResult]
    seconds: float

    @property
    def resolved_rate(self) -> float:
        """Tasks resolved with no monitor flag (reward > 0): the number to report."""
        return sum(r.resolved and r.reward > 0 for r in self.results) / max(len(self.results), 1)

    @property
    def graded_rate(self) -> float:
        """Tasks the grader alone calls resolved, flags ignored (the gap is reward hacking)."""
        return sum(r.resolved for r in self.results) / max(len(self.results), 1)

    @property
    def mean_turns(self) -> float:
        return sum(r.turns for r in self.results) / max(len(self.results), 1)

    @property
    def flags_per_rule(self) -> dict[str, int]:
        return dict(sorted(Counter(rule for r in self.results for rule in r.flags).items()))

    @property
    def errored(self) -> int:
        return sum(r.error is not None for r in self.results)

    def to_dict(self) -> dict[str, Any]:
        return {"tasks": len(self.results), "resolved_rate": self.resolved_rate,
                "graded_rate": self.graded_rate, "mean_turns": self.mean_turns,
                "flags_per_rule": self.flags_per_rule, "errored": self.errored, "seconds": self.seconds,
                "results": [asdict(r) for r in self.results]}  # fmt: skip


def discover_tasks(tasks_dir: Path) -> list[Path]:
    """Task directories under ``tasks_dir``: itself if it is a task, the set's index if present, else every
    child with task.json."""
    tasks_dir = Path(tasks_dir)
    if not tasks_dir.is_dir():
        raise CadenzaError(
            f"{tasks_dir} is not a directory; pass a task set made by 'cadenza tasks build' or a task "
            "directory"
        )
    if (tasks_dir / TASK_JSON).is_file():
        return [tasks_dir]
    found: list[Path] = []
    if (tasks_dir / INDEX).is_file():
        try:
            con = sqlite3.connect(f"file:{tasks_dir / INDEX}?mode=ro", uri=True)
            try:
                rows = con.execute("SELECT id FROM tasks WHERE state = 'ready' ORDER BY id").fetchall()
            finally:
                con.close()
            found = [tasks_dir / r[0] for r in rows if (tasks_dir / r[0] / TASK_JSON).is_file()]
        except sqlite3.Error:
            found = []
    if not found:
        found = sorted(p.parent for p in tasks_dir.glob(f"*/{TASK_JSON}"))
    if not found:
        raise CadenzaError(
            f"{tasks_dir} holds no tasks (no */{TASK_JSON}); build some with 'cadenza tasks build'"
        )
    return found


def _episode_factory(config: EvalConfig) -> Callable[[Path], Env]:
    from cadenza.agent.episode import Episode, EpisodeConfig
    from cadenza.sandbox import SandboxConfig

    def make(task_dir: Path) -> Env:
        return Episode(
            task_dir,
            EpisodeConfig(
                max_turns=config.max_turns,
                judge=config.judge,
                sandbox=SandboxConfig(no_sandbox=config.no_sandbox),
            ),
        )

    return make


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:120] or "task"


def run_task(
    task_dir: Path, client: ChatClient, make_env: Callable[[Path], Env], config: EvalConfig
) -> TaskResult:
    """One task, never raising: environment or endpoint failures become ``error`` on the result."""
    start = time.monotonic()
    task_id = task_dir.name
    try:
        task_id = load_task(task_dir).id
        env = make_env(task_dir)
        try:
            loop = LoopConfig(max_turns=config.max_turns, no_tool_call=config.no_tool_call)  # type: ignore[arg-type]
            traj = run_agent(env, client, config=loop, task_id=task_id)
        finally:
            close = getattr(env, "close", None)
            if callable(close):
                close()
    except Exception as exc:  # one broken task must not end the evaluation
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return TaskResult(
            task_id=task_id, error=f"{type(exc).__name__}: {msg}", seconds=time.monotonic() - start
        )
    path = config.out_dir / f"{_safe(task_id)}.json"
    traj.save(path)
    return _result(traj, typed_outcome(env, traj), path, time.monotonic() - start)


def typed_outcome(env: Env, traj: Trajectory) -> Outcome:
    """The episode's own :class:`Outcome`; for another :class:`Env`, the one its ``finish()`` returned,
    with the flags the loop's monitor pass put on the trajectory."""
    own = getattr(env, "outcome", None)
    if isinstance(own, Outcome):
        return own
    stored = dict(traj.outcome or {})
    stored.setdefault("end_reason", "")
    return Outcome.from_dict(
        {**stored, "reward": traj.reward or 0.0, "flags": [asdict(f) for f in traj.flags]}
    )


def _result(traj: Trajectory, outcome: Outcome, path: Path, seconds: float) -> TaskResult:
    return TaskResult(task_id=traj.task_id, resolved=outcome.resolved, reward=outcome.reward,
                      turns=len(traj.turns), flags=[f.rule for f in outcome.flags], seconds=seconds,
                      error=traj.meta.get("error"), trajectory=str(path),
                      stop_reason=traj.meta.get("stop_reason") or outcome.end_reason or None)  # fmt: skip


def run_task_on_worker(task_dir: Path, config: EvalConfig) -> TaskResult:
    """:func:`run_task` in an executor worker: its own chat client and episode factory."""
    return run_task(task_dir, ChatClient(config.llm), _episode_factory(config), config)


def _pool(config: EvalConfig, make_env: Callable[[Path], Env] | None) -> Any:
    """Threads in this process, or an executor backend (one task per unit, ``concurrency`` CPUs)."""
    ex = config.executor
    if ex is None or ex.kind == "local":
        return ThreadPoolExecutor(max_workers=config.concurrency, thread_name_prefix="cadenza-eval")
    if make_env is not None:
        raise CadenzaError("a custom make_env runs only in this process; use executor 'local'")
    from cadenza.executor import make_executor

    return make_executor(ex)


def evaluate(
    config: EvalConfig,
    *,
    make_env: Callable[[Path], Env] | None = None,
    on_result: Callable[[TaskResult], None] | None = None,
) -> EvalReport:
    """Run every task of ``config.tasks_dir``; ``on_result`` is called (from the caller's thread) as
    each finishes. With ``config.executor`` of kind ``ray`` each task is a unit on the cluster
    (trajectories are written by the worker into ``out_dir``, which must then be on a filesystem every
    node mounts)."""
    tasks = discover_tasks(config.tasks_dir)
    config.out_dir.mkdir(parents=True, exist_ok=True)
    client = ChatClient(config.llm)  # checks the endpoint settings here, before any worker starts
    pool = _pool(config, make_env)
    start = time.monotonic()
    results: list[TaskResult] = []
    if isinstance(pool, ThreadPoolExecutor):
        make_env = make_env or _episode_factory(config)
        futures = {pool.submit(run_task, t, client, make_env, config): t for t in tasks}
    else:
        futures = {pool.submit(run_task_on_worker, t, config): t for t in tasks}
    try:
        for fut in as_completed(futures):
            try:
                res = fut.result()
            except Exception as exc:  # run_task never raises: the worker itself died (after retries)
                first = (str(exc).strip().splitlines() or [""])[0][:200]
                res = TaskResult(
                    task_id=futures[fut].name, error=f"worker lost: {type(exc).__name__}: {first}"
                )
            results.append(res)
            if on_result is not None:
                on_result(res)
    except KeyboardInterrupt:
        # Stop queued tasks, let running episodes clean up, keep what finished.
        _shutdown(pool, cancel=True)
        _write_summary(config, results, start, interrupted=True)
        raise
    except BaseException:
        _shutdown(pool, cancel=True)
        raise
    _shutdown(pool)
    return _write_summary(config, results, start)


def _shutdown(pool: Any, *, cancel: bool = False) -> None:
    if isinstance(pool, ThreadPoolExecutor):
        pool.shutdown(wait=True, cancel_futures=cancel)
    else:
        pool.close()


def _write_summary(
    config: EvalConfig, results: list[TaskResult], start: float, *, interrupted: bool = False
) -> EvalReport:
    results.sort(key=lambda r: r.task_id)
    report = EvalReport(results=results, seconds=time.monotonic() - start)
    atomic_write_json(config.out_dir / "summary.json", {**report.to_dict(), "interrupted": interrupted})
    return report
