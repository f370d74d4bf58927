"""Shared fixtures for rl tests: a locally trained tokenizer, a tiny counting env, a scripted policy."""

from __future__ import annotations

import json
from typing import Any

from cadenza.agent.env import StepResult, ToolCall
from cadenza.rl.engines.policy import Sample, SampleRequest
from cadenza.rl.text.chat import train_tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "add x to the counter",
            "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "submit",
            "description": "finish",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]


class CounterEnv:
    """Reach ``target`` with ``add`` calls, then ``submit``. Answers like the real agent env."""

    def __init__(self, target: int = 3) -> None:
        self.target = target
        self.total = 0
        self.submitted = False

    def reset(self) -> list[dict[str, Any]]:
        self.total, self.submitted = 0, False
        return [
            {"role": "system", "content": "You are a counting agent."},
            {"role": "user", "content": f"Make the counter reach {self.target}, then submit."},
        ]

    def tools(self) -> list[dict[str, Any]]:
        return TOOLS

    def step(self, call: ToolCall) -> StepResult:
        if call.name not in ("add", "submit"):
            return StepResult(
                observation=f"error: tool {call.name!r} not found", done=False, error_kind="tool_not_found"
            )
        if call.name == "submit":
            self.submitted = True
            return StepResult(observation="submitted", done=True)
        if not isinstance(call.arguments, dict) or not isinstance(call.arguments.get("x"), int):
            return StepResult(
                observation="error: add needs an integer x", done=False, error_kind="invalid_arguments"
            )
        self.total += call.arguments["x"]
        return StepResult(observation=f"counter = {self.total}", done=False)

    def finish(self) -> dict[str, Any]:
        ok = self.submitted and self.total == self.target
        return {"reward": 1.0 if ok else 0.0, "resolved": ok}


def corpus() -> list[str]:
    calls = [
        json.dumps({"name": n, "arguments": a})
        for n, a in [("add", {"x": 1}), ("add", {"x": 2}), ("submit", {})]
    ]
    texts = [
        "You are a counting agent. Make the counter reach 3, then submit.",
        "counter = 1 2 3 error: tool not found",
        "Reminder: the available tools are add, submit.",
        *calls,
        json.dumps(TOOLS),
    ]
    return texts * 20


def make_tokenizer(vocab_size: int = 512) -> Any:
    return train_tokenizer(corpus(), vocab_size=vocab_size)


class ScriptedPolicy:
    """A Policy that emits fixed texts turn by turn (per prompt count), with log-prob -1 per token."""

    def __init__(self, tokenizer: Any, turns: list[str]) -> None:
        self.tokenizer = tokenizer
        self.turns = turns
        self.calls = 0

    def sample(self, request: SampleRequest) -> list[Sample]:
        text = self.turns[min(self.calls, len(self.turns) - 1)]
        self.calls += 1
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.tokenizer.eos_token_id]
        ids = ids[: request.params.max_new_tokens]
        finish = "stop" if ids[-1] == self.tokenizer.eos_token_id else "length"
        return [
            Sample(token_ids=list(ids), logprobs=[-1.0] * len(ids), finish_reason=finish)
            for _ in request.prompts
        ]
