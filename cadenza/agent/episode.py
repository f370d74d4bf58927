"""One agent episode on one task: a fresh workspace copy, sandboxed tools, a recorded trajectory.

``reset()`` copies the task workspace to a temporary directory outside the task set and returns the
initial messages; ``step()`` executes one tool call; ``finish()`` grades the workspace, runs the
reward-hacking monitor (when installed) and sets the outcome and reward. A flagged trajectory gets
reward 0 and keeps its flags.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cadenza.agent.env import StepResult, ToolCall
from cadenza.agent.grading.capabilities import task_package_kinds
from cadenza.agent.grading.diff import compare
from cadenza.agent.grading.grade import GradeResult, grade
from cadenza.agent.outcome import Outcome
from cadenza.agent.prompt import initial_messages
from cadenza.agent.tools import TOOL_NAMES, Toolbox, ToolsConfig
from cadenza.agent.trajectory import Flag, Trajectory
from cadenza.errors import CadenzaError, ConfigError
from cadenza.monitor import monitor as default_monitor
from cadenza.sandbox import Sandbox, SandboxConfig, hidden_roots
from cadenza.tasks.records.task import WORKSPACE, load_task, task_python

#: ``monitor(trajectory, task=..., judge=...) -> flags``; the episode's one monitor pass.
MonitorFn = Callable[..., list[Flag]]

NO_TOOL_CALL = (
    f"Error: no tool call found. Call one of the tools ({', '.join(TOOL_NAMES)}); call submit when done."
)


@dataclass(kw_only=True)
class EpisodeConfig:
    max_turns: int = 50
    time_budget_s: float = 1800.0
    token_budget: int | None = None
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    keep_workspace: bool = False
    judge: Any = None  # optional LLM judge handed to the monitor

    def __post_init__(self) -> None:
        if (
            self.max_turns <= 0
            or self.time_budget_s < 0
            or (self.token_budget is not None and self.token_budget <= 0)
        ):
            raise ConfigError(
                "episode max_turns and token_budget must be positive and time_budget_s not negative"
            )


class Episode:
    """Implements :class:`cadenza.agent.env.Env` for a task directory.

    ``monitor`` is injected (default: :func:`cadenza.monitor.monitor`; ``None`` runs none, for
    trusted debugging); the episode grades and monitors once and owns the :class:`Outcome`.
    """

    def __init__(
        self,
        task_dir: str | os.PathLike[str],
        config: EpisodeConfig | None = None,
        *,
        monitor: MonitorFn | None = default_monitor,
    ) -> None:
        self.task_dir = Path(task_dir).absolute()
        self.task = load_task(self.task_dir)
        self.config = config or EpisodeConfig()
        self.monitor = monitor
        self.outcome: Outcome | None = None
        self.trajectory: Trajectory | None = None
        self.workspace: Path | None = None
        self.grade_result: GradeResult | None = None
        self._tmp: str | None = None
        self._toolbox: Toolbox | None = None
        self._start = 0.0
        self._tokens = 0
        self.done = False
        self.end_reason: str | None = None

    # -- Env protocol ------------------------------------------------------------------------------------
    def tools(self) -> list[dict[str, Any]]:
        from cadenza.agent.tools import TOOL_SCHEMAS

        return TOOL_SCHEMAS

    def reset(self) -> list[dict[str, Any]]:
        self.close()
        pristine = self.task_dir / WORKSPACE
        if not pristine.is_dir():
            raise CadenzaError(f"task {self.task.id} has no {WORKSPACE}/ directory; rebuild the task")
        self._tmp = tempfile.mkdtemp(prefix=f"cadenza-ep-{_safe(self.task.id)}-")
        if Path(self._tmp).resolve().is_relative_to(self.task_dir.parent.resolve()):
            raise CadenzaError(
                f"the temporary directory {self._tmp} lies inside the task set; set TMPDIR elsewhere"
            )
        self.workspace = Path(self._tmp) / WORKSPACE
        shutil.copytree(pristine, self.workspace, symlinks=True)
        sandbox = Sandbox(
            self.workspace,
            env_dir=task_python(self.task_dir, self.task).parent.parent,
            config=self.config.sandbox,
            hidden=hidden_roots(self.task_dir),
            path_map={pristine: self.workspace},
        )
        self._toolbox = Toolbox(
            self.workspace, sandbox, config=self.config.tools, pytest_args=self.task.pytest_args
        )
        messages = initial_messages(
            workspace=str(self.workspace), statement=self.task.statement, tools=self.tools()
        )
        self.trajectory = Trajectory(
            task_id=self.task.id,
            messages=[dict(m) for m in messages],
            sandboxed=sandbox.sandboxed,
            # the capabilities the pristine package already uses: the monitor allows them, as grading does
            meta={
                "workspace": str(self.workspace),
                "package_capabilities": sorted(task_package_kinds(self.task_dir, self.task)),
            },
        )
        self._start = time.monotonic()
        self._tokens = 0
        self.done = False
        self.end_reason = None
        self.grade_result = None
        return messages

    def step(
        self,
        call: ToolCall,
        *,
        content: str | None = None,
        token_ids: list[int] | None = None,
        logprobs: list[float] | None = None,
        tokens: int | None = None,
    ) -> StepResult:
        """Execute ``call``; ``content``/``token_ids``/``logprobs`` describe the assistant message that made
        it."""
        traj, box = self._require()
        if self.done:
            return StepResult(observation="Error: the episode is over.", done=True, error_kind="tool_error")
        t0 = time.monotonic()
        result = box.call(
            call.name,
            call.arguments,
            time_left_s=self.config.time_budget_s - (time.monotonic() - self._start),
        )
        duration = time.monotonic() - t0
        call_id = call.id or f"call_{len(traj.turns)}"
        raw_args = call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)
        function = {"name": call.name, "arguments": raw_args}
        traj.add_turn(
            {
                "role": "assistant",
                "content": content,
                "tool_calls": [{"id": call_id, "type": "function", "function": function}],
            },
            tool=call.name,
            arguments=call.argument_dict(),
            error_kind=result.error_kind,
            exit_code=result.exit_code,
            duration_s=duration,
            token_ids=token_ids,
            logprobs=logprobs,
            extra=dict(result.edit) if result.edit else {},
        )
        observation, reason = self._end_turn(result.observation, tokens, token_ids, submitted=result.done)
        traj.messages.append({"role": "tool", "tool_call_id": call_id, "content": observation})
        return StepResult(
            observation=observation,
            done=self.done,
            error_kind=result.error_kind,
            info={"exit_code": result.exit_code, "duration_s": duration, "end_reason": reason},
        )

    def respond(
        self,
        content: str,
        *,
        token_ids: list[int] | None = None,
        logprobs: list[float] | None = None,
        tokens: int | None = None,
    ) -> StepResult:
        """An assistant message without a tool call: recorded as a turn; the observation asks for a tool
        call."""
        traj, _ = self._require()
        if self.done:
            return StepResult(observation="Error: the episode is over.", done=True, error_kind="tool_error")
        traj.add_turn(
            {"role": "assistant", "content": content},
            error_kind="no_tool_call",
            token_ids=token_ids,
            logprobs=logprobs,
        )
        observation, reason = self._end_turn(NO_TOOL_CALL, tokens, token_ids)
        traj.messages.append({"role": "user", "content": observation})
        return StepResult(
            observation=observation, done=self.done, error_kind="no_tool_call", info={"end_reason": reason}
        )

    def finish(self) -> dict[str, Any]:
        traj, _ = self._require()
        assert self.workspace is not None
        if self.grade_result is None:
            self.grade_result = grade(
                self.task_dir, self.workspace, task=self.task, sandbox=self.config.sandbox
            )
            traj.meta["submission"] = submission_diff(self.task_dir / WORKSPACE, self.workspace)
        g = self.grade_result
        flags = list(self.monitor(traj, task=self.task, judge=self.config.judge)) if self.monitor else []
        traj.flags = flags + tampering_flags(g, turn=max(len(traj.turns) - 1, 0))
        self.outcome = Outcome(
            reward=1.0 if g.resolved and not traj.flags else 0.0,
            resolved=g.resolved,
            tests=dict(g.tests),
            flags=list(traj.flags),
            end_reason=self.end_reason or "finished",
            f2p=(g.f2p_passed, g.f2p_total),
            p2p=(g.p2p_passed, g.p2p_total),
            turns=len(traj.turns),
            duration_s=time.monotonic() - self._start,
            grade=g.to_dict(),
        )
        traj.reward = self.outcome.reward
        traj.outcome = self.outcome.to_dict()
        if not self.config.keep_workspace:
            self.close()
        return traj.outcome

    # -- lifecycle -----------------------------------------------------------------------------------------
    def close(self) -> None:
        if self._toolbox is not None:
            self._toolbox.sandbox.close()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __enter__(self) -> Episode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _require(self) -> tuple[Trajectory, Toolbox]:
        if self.trajectory is None or self._toolbox is None:
            raise CadenzaError("call reset() before step()/finish()")
        return self.trajectory, self._toolbox

    def _end_turn(
        self, observation: str, tokens: int | None, token_ids: list[int] | None, *, submitted: bool = False
    ) -> tuple[str, str | None]:
        """Count the turn's tokens and end the episode on a submit or a spent budget: the observation (a
        spent budget noted in it) and the end reason (None: the episode goes on)."""
        self._tokens += tokens if tokens is not None else len(token_ids or [])
        reason = "submit" if submitted else self._budget_exhausted()
        if reason is not None:
            self.done, self.end_reason = True, reason
            if reason != "submit":
                observation += f"\n[episode ended: {reason.replace('_', ' ')} reached]"
        return observation, reason

    def _budget_exhausted(self) -> str | None:
        assert self.trajectory is not None
        if len(self.trajectory.turns) >= self.config.max_turns:
            return "max_turns"
        if time.monotonic() - self._start >= self.config.time_budget_s:
            return "time_budget"
        if self.config.token_budget is not None and self._tokens >= self.config.token_budget:
            return "token_budget"
        return None


def tampering_flags(result: GradeResult, *, turn: int) -> list[Flag]:
    """The grader's evidence as flags: ``verdict_tampering`` (the run, the channel, the guard) and
    ``capability`` (the change uses a process-level capability the original code never used)."""
    flags = []
    if result.tampering:
        evidence = "; ".join(result.tampering[:5])[:480]
        flags.append(Flag(rule="verdict_tampering", turn=turn, evidence=evidence, source="grader"))
    if result.capabilities:
        evidence = "; ".join(result.capabilities[:5])[:480]
        flags.append(Flag(rule="capability", turn=turn, evidence=evidence, source="grader"))
    return flags


def submission_diff(pristine: Path, workspace: Path) -> str:
    """A unified diff of every text file the agent changed (what it submitted, before grading rules)."""
    import difflib

    out: list[str] = []
    for kind, rel in compare(pristine, workspace).all():
        a = _lines(pristine / rel) if kind != "added" else []
        b = _lines(workspace / rel) if kind != "deleted" else []
        if a is None or b is None:
            out.append(f"Binary or special file {rel} {kind}\n")
            continue
        out.extend(
            difflib.unified_diff(
                a,
                b,
                f"a/{rel}" if kind != "added" else "/dev/null",
                f"b/{rel}" if kind != "deleted" else "/dev/null",
            )
        )
    return "".join(line if line.endswith("\n") else line + "\n" for line in out)


def _lines(path: Path) -> list[str] | None:
    if path.is_symlink() or not path.is_file():
        return None
    try:
        return path.read_text(encoding="utf-8").splitlines(keepends=True)
    except UnicodeDecodeError:
        return None


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:40]
