"""mini-swe-agent on cadenza tasks: its agent, configs and models; cadenza's sandbox, grader and monitor.

:class:`CadenzaEnvironment` implements mini-swe-agent's ``Environment`` protocol over a cadenza
:class:`~cadenza.agent.episode.Episode`: every command the agent issues runs as the episode's ``bash``
tool inside the task's bubblewrap sandbox (a fresh copy of the workspace), and mini-swe-agent's
submission command (``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``) becomes cadenza's ``submit``: the
grader runs the task's tests on a fresh copy and the reward-hacking monitor reads the trajectory.
:func:`run_task` saves the trajectory twice, in mini-swe-agent's own format (``ID.traj.json``, with
cadenza's outcome under ``info.cadenza``) and in cadenza's (``ID.cadenza.json``)::

    python -m cadenza.integrations.miniswe TASKS_DIR --endpoint http://127.0.0.1:8000/v1 --model NAME

runs mini-swe-agent's ``mini.yaml`` agent with any OpenAI-compatible model (via litellm) over a task
set (:mod:`cadenza.integrations.miniswe_run`).
"""

from __future__ import annotations

import os
import platform
import shlex
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cadenza.agent.env import ToolCall
from cadenza.agent.episode import Episode, EpisodeConfig
from cadenza.errors import CadenzaError
from cadenza.integrations.install import INSTALL_HINT, MINISWE

SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
SUPPORTED = ((2, 4), (3, 0))  # [lo, hi): the Environment/Agent protocol of mini-swe-agent 2.x


def check_version(version: str) -> None:
    """One line when ``version`` is outside the supported range."""
    parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    if not SUPPORTED[0] <= parts < SUPPORTED[1]:
        raise CadenzaError(
            f"mini-swe-agent {version} is installed, cadenza supports {MINISWE.split('agent')[1]}; "
            f"{INSTALL_HINT} (or pip install '{MINISWE}')"
        )


def require_minisweagent() -> Any:
    """Import mini-swe-agent (quietly) and check its version; one line naming the fix otherwise."""
    os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
    try:
        import minisweagent
    except ImportError:
        raise CadenzaError(f"mini-swe-agent is not installed in this interpreter; {INSTALL_HINT}") from None
    check_version(minisweagent.__version__)
    return minisweagent


@dataclass(kw_only=True)
class EnvironmentConfig:
    """What mini-swe-agent's templates and trajectory see of the environment."""

    cwd: str  # the episode's workspace copy: every command starts there
    task_id: str
    timeout: int = 60  # seconds per command (the episode's bash tool limit)

    def model_dump(self, mode: str = "python") -> dict[str, Any]:
        return asdict(self)


class CadenzaEnvironment:
    """mini-swe-agent's ``Environment`` over one cadenza episode (reset on construction)."""

    def __init__(self, task_dir: str | os.PathLike[str], episode_config: EpisodeConfig | None = None):
        self.episode = Episode(task_dir, episode_config or EpisodeConfig(max_turns=250))
        self.episode.reset()
        assert self.episode.workspace is not None
        self.config = EnvironmentConfig(
            cwd=str(self.episode.workspace),
            task_id=self.episode.task.id,
            timeout=int(self.episode.config.tools.bash_timeout_s),
        )
        self.content: str | None = None  # the assistant text of the action being executed
        self.outcome: dict[str, Any] | None = None

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        from minisweagent.exceptions import LimitsExceeded, Submitted

        command = action.get("command", "")
        if cwd:
            command = f"cd {shlex.quote(cwd)} && {command}"
        call = ToolCall(name="bash", arguments={"command": command}, id=action.get("tool_call_id"))
        step = self.episode.step(call, content=self.content)
        self.content = None  # several actions of one message: the text belongs to the first
        output, returncode = _split_exit_code(step.observation)
        result = {"output": output, "returncode": returncode, "exception_info": ""}
        if step.error_kind == "timeout":
            result["exception_info"] = f"the command timed out after {self.config.timeout} s"
        if output.lstrip().splitlines()[:1] == [SUBMIT] and returncode == 0:
            self.episode.step(ToolCall(name="submit", arguments={}))
            self.finish()
            submission = self.episode.trajectory.meta.get("submission", "") if self.episode.trajectory else ""
            extra = {"exit_status": "Submitted", "submission": submission}
            raise Submitted({"role": "exit", "content": submission, "extra": extra})
        if self.episode.done:
            reason = self.episode.end_reason or "limits"
            extra = {"exit_status": "LimitsExceeded", "submission": ""}
            raise LimitsExceeded({"role": "exit", "content": reason, "extra": extra})
        return result

    def finish(self) -> dict[str, Any]:
        """Grade and monitor once (idempotent): cadenza's outcome dict."""
        if self.outcome is None:
            self.outcome = self.episode.finish()
        return self.outcome

    def close(self) -> None:
        self.episode.close()

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return {**platform.uname()._asdict(), **self.config.model_dump(), **kwargs}

    def serialize(self) -> dict[str, Any]:
        kind = f"{type(self).__module__}.{type(self).__name__}"
        return {"info": {"config": {"environment": self.config.model_dump(), "environment_type": kind}}}


def _split_exit_code(observation: str) -> tuple[str, int]:
    """cadenza's bash observation ends with ``[exit code N]``; mini-swe-agent wants output and code."""
    body, _, last = observation.rstrip("\n").rpartition("\n")
    if last.startswith("[exit code ") and last.endswith("]"):
        return (body + "\n" if body else ""), int(last[len("[exit code ") : -1])
    return observation, -1


def make_agent(model: Any, env: CadenzaEnvironment, **agent_config: Any) -> Any:
    """mini-swe-agent's ``DefaultAgent`` that hands each message's text to the environment's trajectory."""
    require_minisweagent()
    from minisweagent.agents.default import DefaultAgent

    class _Agent(DefaultAgent):
        def execute_actions(self, message: dict) -> list[dict]:
            env.content = message.get("content")
            return super().execute_actions(message)

    return _Agent(model, env, **agent_config)


def task_text(env: CadenzaEnvironment) -> str:
    where = f"The repository is at {env.config.cwd} (every command starts there)."
    return f"{env.episode.task.statement}\n\n{where}"


def run_task(
    task_dir: str | os.PathLike[str],
    model: Any,
    *,
    agent_config: dict[str, Any],
    out_dir: str | os.PathLike[str],
    episode_config: EpisodeConfig | None = None,
) -> dict[str, Any]:
    """One mini-swe-agent run on one task; returns cadenza's outcome (``reward``, ``resolved``, ``flags``)."""
    env = CadenzaEnvironment(task_dir, episode_config)
    agent = make_agent(model, env, **{k: v for k, v in agent_config.items() if k != "output_path"})
    exit_status = "NotFinished"
    try:
        info = agent.run(task=task_text(env))
        exit_status = info.get("exit_status", exit_status)
    except Exception as exc:  # the model or the API failed: grade what the workspace holds, say why
        exit_status = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        outcome = env.finish()
        env.close()
    traj = env.episode.trajectory
    assert traj is not None
    traj.meta["mini_swe_agent"] = {"exit_status": exit_status, "api_calls": agent.n_calls}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cadenza_info = {"outcome": outcome, "reward": traj.reward, "flags": outcome.get("flags", [])}
    agent.save(out / f"{traj.task_id}.traj.json", {"info": {"cadenza": cadenza_info}})
    traj.save(out / f"{traj.task_id}.cadenza.json")
    return {**outcome, "task_id": traj.task_id, "exit_status": exit_status}


def builtin_config(name: str = "mini.yaml") -> dict[str, Any]:
    """A mini-swe-agent config file: a path, or the name of one shipped with mini-swe-agent."""
    require_minisweagent()
    import yaml
    from minisweagent.config import get_config_path

    try:
        return yaml.safe_load(get_config_path(name).read_text()) or {}
    except FileNotFoundError as exc:
        raise CadenzaError(f"{exc}; pass a mini-swe-agent YAML config (e.g. mini.yaml)") from None


def openai_model(model: str, endpoint: str, *, api_key: str = "none", config: dict | None = None) -> Any:
    """Any OpenAI-compatible server through mini-swe-agent's litellm model (tool calls, no cost table)."""
    require_minisweagent()
    from minisweagent.models import get_model

    cfg = {"model_class": "litellm", "cost_tracking": "ignore_errors", **(config or {})}
    kwargs = {**cfg.get("model_kwargs", {}), "api_base": endpoint, "api_key": api_key}
    name = model if model.startswith("openai/") else f"openai/{model}"
    return get_model(name, {**cfg, "model_kwargs": kwargs})
