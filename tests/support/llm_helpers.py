"""A tiny environment for the LLM-agent loop tests (shared by test_llm_loop and test_eval_library)."""

from __future__ import annotations

import json
from typing import Any

from cadenza.agent.env import StepResult, ToolCall


class ReachFiveEnv:
    """A tiny Env: ``add(n)`` adds to a counter, ``bash`` echoes, ``submit`` ends; reward 1 when the counter
    hits 5."""

    def __init__(self) -> None:
        self.total = 0
        self.calls: list[ToolCall] = []
        self.finished = False

    def reset(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": "count"}, {"role": "user", "content": "reach 5"}]

    def tools(self) -> list[dict[str, Any]]:
        return [
            {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
            for n in ("add", "bash", "submit")
        ]

    def step(self, call: ToolCall) -> StepResult:
        self.calls.append(call)
        if call.name == "add":
            if not isinstance(call.arguments, dict) or not isinstance(call.arguments.get("n"), int):
                return StepResult(
                    observation="Error: add needs an integer n", done=False, error_kind="invalid_arguments"
                )
            self.total += call.arguments["n"]
            return StepResult(observation=str(self.total), done=False)
        if call.name == "bash":
            return StepResult(observation="(not executed)", done=False, info={"exit_code": 0})
        if call.name == "submit":
            return StepResult(observation="submitted", done=True)
        return StepResult(
            observation=f"Error: tool '{call.name}' not found", done=False, error_kind="tool_not_found"
        )

    def finish(self) -> dict[str, Any]:
        self.finished = True
        return {"resolved": self.total == 5, "reward": float(self.total == 5)}


# What vLLM answers (HTTP 400) when a request exceeds the model's context.
VLLM_CONTEXT_400 = json.dumps(
    {
        "object": "error",
        "message": "This model's maximum context length is 8192 tokens. However, you requested 8230 tokens "
        "(8102 in the messages, 128 in the completion). Please reduce the length of the messages or "
        "completion.",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
).encode()
