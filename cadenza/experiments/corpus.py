"""The supervised corpus that makes the pre-RL policy of the tool-hint experiment.

Transcripts of toolworld episodes in which, once the available tools are listed in context (the
tool-list hint, as a user message right before a turn), every call uses a listed tool; before that,
each call picks uniformly among the operation's aliases across profiles (tool-not-found answers
follow as the environment would give them, and the step is retried). So the SFT model *can* use the
right tool when told, but has no reason to prefer one alias from the profile name alone: that gap is
what RL, with or without hints, has to close. Uninformative reminders of the same shape as the
placebo arm's hint appear at the same rate and change nothing, so the placebo is a true control.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from cadenza.agent.env import ToolCall
from cadenza.experiments.toolworld import (  # call_message, tool_list_hint: re-exported here
    PROFILES,
    ToolworldConfig,
    ToolworldEnv,
    call_message,
    sample_task,
    tool_list_hint,
)
from cadenza.feedback.generate import placebo_text


def aliases(operation: str, profiles: list[str]) -> list[str]:
    return [PROFILES[p][operation] for p in profiles]


def transcript(
    rng: random.Random,
    config: ToolworldConfig,
    *,
    p_hint: float = 0.25,
    p_placebo: float = 0.25,
    placebo_length: Callable[[str], int] = len,
) -> list[dict[str, Any]]:
    """One SFT transcript (OpenAI messages). At each turn before any hint, a hint (tool list) is inserted
    with probability ``p_hint`` and an uninformative reminder with probability ``p_placebo``. Pass the
    tokenizer's token count as ``placebo_length`` so the reminder is the very text (same token sequence)
    the placebo arm's feedback produces during RL."""
    task = sample_task(rng, config)
    env = ToolworldEnv(task, config)
    messages = env.reset()
    listed = False
    remaining = list(task.steps)
    for i in range(env.max_turns):
        if not listed:
            r = rng.random()
            if r < p_hint:
                messages.append({"role": "user", "content": tool_list_hint(env)})
                listed = True
            elif r < p_hint + p_placebo:
                messages.append(
                    {"role": "user", "content": placebo_text(tool_list_hint(env), placebo_length)}
                )
        step = remaining[0]
        name = (
            PROFILES[task.profile][step.operation]
            if listed
            else rng.choice(aliases(step.operation, config.profiles))
        )
        messages.append(call_message(name, step.path, i))
        result = env.step(ToolCall(name=name, arguments={"path": step.path}, id=f"call_{i}"))
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": result.observation})
        if result.error_kind is None:
            remaining.pop(0)
        if result.done:
            break
    return messages


def corpus(
    seed: int, n: int, config: ToolworldConfig | None = None, *, placebo_length: Callable[[str], int] = len
) -> list[list[dict[str, Any]]]:
    """``n`` transcripts; the random choices depend only on ``seed`` (not on ``placebo_length``)."""
    rng = random.Random(seed)
    config = config or ToolworldConfig()
    return [transcript(rng, config, placebo_length=placebo_length) for _ in range(n)]
