"""The environment protocol shared by the real agent episode and toy environments (toolworld).

A policy acts through tool calls; the environment answers each with an observation. Rollout code
in ``cadenza.rl`` drives any object that satisfies :class:`Env`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(kw_only=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] | str  # a str when the model produced arguments that are not a JSON object
    id: str = ""

    def argument_dict(self) -> dict[str, Any]:
        """The arguments as a trajectory records them: a JSON object, or ``{"_raw": text}`` when not one."""
        return self.arguments if isinstance(self.arguments, dict) else {"_raw": self.arguments}


@dataclass(kw_only=True)
class StepResult:
    observation: str
    done: bool
    error_kind: str | None = None  # see cadenza.agent.trajectory.ERROR_KINDS
    info: dict[str, Any] = field(default_factory=dict)


class Env(Protocol):
    def reset(self) -> list[dict[str, Any]]:
        """Start an episode; return the initial OpenAI-format messages (system with tools, user with the
        task)."""

    def tools(self) -> list[dict[str, Any]]:
        """OpenAI function-calling schemas of the tools available in this episode."""

    def step(self, call: ToolCall) -> StepResult:
        """Execute one tool call."""

    def finish(self) -> dict[str, Any]:
        """End the episode (grade if needed); return the outcome with at least ``reward`` (float) and
        ``resolved`` (bool)."""


class NoToolsView:
    """An env whose tool list is not rendered into the prompt (``env.show_tools = False``, e.g. toolworld);
    the real schemas stay on the wrapped env for the feedback generators."""

    def __init__(self, env: Env):
        self.env = env

    def reset(self) -> list[dict[str, Any]]:
        return self.env.reset()

    def tools(self) -> list[dict[str, Any]]:
        return []

    def step(self, call: ToolCall) -> StepResult:
        return self.env.step(call)

    def finish(self) -> dict[str, Any]:
        return self.env.finish()
