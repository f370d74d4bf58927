"""Rollouts: drive any :class:`cadenza.agent.env.Env` with a :class:`Policy`, G samples per task.

All live episodes generate their next turn in one batched ``policy.sample`` call. Each episode becomes
a :class:`TokenTrajectory` (exact sampled ids + behaviour log-probs; prompt/observation tokens from
incremental chat-template rendering) and a cadenza :class:`Trajectory` (OpenAI messages, one
``TurnMeta`` per model turn with ``token_ids``/``logprobs`` filled), plus the env's outcome reward.

An assistant turn without a tool call ends the episode (it is the final answer), as do ``done`` from
the env, ``max_turns``, and running out of context (``max_context_tokens``, or the engine's own window:
a :class:`Sample` with ``finish_reason == "context"`` or :class:`ContextLengthExceeded` from the engine),
all graded alike. Every turn records the policy version that sampled it (``TurnMeta.extra``); the
trajectory's ``meta["policy_version"]`` is the oldest of them (what staleness is measured from).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from cadenza.agent.env import Env
from cadenza.agent.trajectory import Trajectory, TurnMeta
from cadenza.errors import CadenzaError, ContextLengthExceeded
from cadenza.rl.config import RolloutParams
from cadenza.rl.engines.policy import Policy, Sample, SampleRequest, SamplingParams
from cadenza.rl.text.chat import (
    assistant_message,
    parse_tool_calls,
    render_continuation,
    require_chat_template,
    turn_end_glue,
)
from cadenza.rl.text.tokens import TokenTrajectory, TokenTrajectoryBuilder


@dataclass(kw_only=True)
class RolloutTask:
    """One task to roll out: ``make_env`` is called once per sample (each sample gets a fresh env)."""

    task_id: str
    make_env: Callable[[], Env]


@dataclass(kw_only=True)
class Rollout:
    tokens: TokenTrajectory
    trajectory: Trajectory
    outcome: dict[str, Any] = field(default_factory=dict)

    @property
    def reward(self) -> float:
        return self.tokens.reward


@dataclass(kw_only=True)
class _Episode:
    task_id: str
    group_id: str
    env: Env
    tools: list[dict[str, Any]]
    messages: list[dict[str, Any]]
    builder: TokenTrajectoryBuilder
    turns: list[TurnMeta] = field(default_factory=list)
    stop_reason: str = ""


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False)) if text else []


def _start(tokenizer: Any, task: RolloutTask, group_id: str, prefix: str = "") -> _Episode:
    env = task.make_env()
    messages = [dict(m) for m in env.reset()]
    tools = list(env.tools())
    if not messages:
        raise CadenzaError(f"env for task {task.task_id!r} returned no initial messages from reset()")
    builder = TokenTrajectoryBuilder()
    for i, msg in enumerate(messages):
        text = render_continuation(tokenizer, messages[:i], [msg], tools, add_generation_prompt=False)
        builder.add("system" if msg.get("role") == "system" else "prompt", _encode(tokenizer, text), i)
    ep = _Episode(
        task_id=task.task_id, group_id=group_id, env=env, tools=tools, messages=messages, builder=builder
    )
    _add_generation_prompt(tokenizer, ep, prefix)
    return ep


def _add_generation_prompt(tokenizer: Any, ep: _Episode, prefix: str = "") -> None:
    text = render_continuation(tokenizer, ep.messages, [], ep.tools, add_generation_prompt=True) + prefix
    ep.builder.add("prompt", _encode(tokenizer, text), len(ep.messages))


def rollout(
    policy: Policy,
    tokenizer: Any,
    tasks: Sequence[RolloutTask],
    config: RolloutParams,
    *,
    seed: int = 0,
    on_episode_done: Callable[[int, int], None] | None = None,
    group_offset: int = 0,
) -> list[Rollout]:
    """Roll out ``config.group_size`` episodes per task; results are ordered task by task.

    ``config`` is the run's ``[rollout]`` (a :class:`~cadenza.rl.config.RolloutConfig` is one) or a
    bare :class:`RolloutParams`; ``seed`` seeds the sampling generator (the trainer derives it from
    the run seed and the step).
    ``group_id`` of every sample of ``tasks[i]`` is ``f"{group_offset + i}:{task_id}"`` (GRPO groups;
    the offset keeps ids unique when one step's tasks are rolled out in separate units).
    ``on_episode_done(finished, total)`` is called as episodes end (for progress bars).
    """
    require_chat_template(tokenizer)
    eos = tokenizer.eos_token_id
    if eos is None:
        raise CadenzaError("the tokenizer has no eos token; set tokenizer.eos_token to the end-of-turn token")
    if not tasks:
        raise CadenzaError("no tasks to roll out")
    generator = torch.Generator().manual_seed(seed)
    episodes = [
        _start(tokenizer, task, f"{group_offset + i}:{task.task_id}", config.response_prefix)
        for i, task in enumerate(tasks)
        for _ in range(config.group_size)
    ]
    live = list(range(len(episodes)))
    finished = 0
    while live:
        budget = {i: config.max_context_tokens - len(episodes[i].builder) for i in live}
        for i in [i for i in live if budget[i] < 1]:
            episodes[i].stop_reason = "context"
        live = [i for i in live if budget[i] >= 1]
        if not live:
            break
        params = SamplingParams(
            max_new_tokens=min(config.max_new_tokens, max(budget[i] for i in live)),
            temperature=config.temperature,
            top_k=config.top_k,
            stop_token_ids=(int(eos),),
        )
        samples = _sample(
            policy, SampleRequest([episodes[i].builder.input_ids for i in live], params, generator)
        )
        still = []
        for i, sample in zip(live, samples, strict=True):
            ep = episodes[i]
            if sample.finish_reason == "context":  # the engine's context window is full: graded as is
                ep.stop_reason = "context"
                finished += 1
                if on_episode_done is not None:
                    on_episode_done(finished, len(episodes))
                continue
            ids, lps, finish = sample.token_ids, sample.logprobs, sample.finish_reason
            if (
                len(ids) > budget[i]
            ):  # this episode's context is nearly full: keep what fits (a prefix of a sample is a sample)
                ids, lps, finish = ids[: budget[i]], lps[: budget[i]], "length"
            if _advance(tokenizer, ep, ids, lps, finish, config, sample.policy_version):
                still.append(i)
            else:
                finished += 1
                if on_episode_done is not None:
                    on_episode_done(finished, len(episodes))
        live = still
    return [_finish(ep) for ep in episodes]


def _sample(policy: Policy, request: SampleRequest) -> list[Sample]:
    """One batched call; when the engine refuses the batch as too long, find out prompt by prompt."""
    try:
        return policy.sample(request)
    except ContextLengthExceeded:
        if len(request.prompts) == 1:
            return [Sample(token_ids=[], logprobs=[], finish_reason="context")]
        return [_sample(policy, request.part([p], request.generator))[0] for p in request.prompts]


def _advance(
    tokenizer: Any,
    ep: _Episode,
    ids: list[int],
    logprobs: list[float],
    finish_reason: str,
    config: RolloutParams,
    policy_version: int = 0,
) -> bool:
    """Record one sampled turn and the env's answers; return whether the episode continues."""
    if not ids:
        raise CadenzaError("the policy returned an empty turn; a Policy must sample at least one token")
    msg_index = len(ep.messages)
    ep.builder.add("assistant", ids, msg_index, logprobs)
    text = tokenizer.decode(ids, skip_special_tokens=False)
    if finish_reason == "stop" and text.endswith(tokenizer.eos_token):
        text = text[: -len(tokenizer.eos_token)]
    else:  # cut off by max_new_tokens: close the turn so the next segment renders as the template expects
        ep.builder.add("prompt", [int(tokenizer.eos_token_id)], msg_index)
    text = config.response_prefix + text
    calls = parse_tool_calls(text)
    msg = assistant_message(text, calls)
    ep.messages.append(msg)
    turn = TurnMeta(
        index=len(ep.turns), message_index=msg_index, token_ids=list(ids), logprobs=list(logprobs)
    )
    ep.turns.append(turn)
    turn.extra["policy_version"] = int(policy_version)
    if finish_reason != "stop":
        turn.extra["truncated"] = True
    if calls:
        turn.tool = calls[0].name
        turn.arguments = calls[0].arguments if isinstance(calls[0].arguments, dict) else None
        turn.extra["calls"] = [{"name": c.name, "arguments": c.arguments, "id": c.id} for c in calls]
    if not calls:
        ep.stop_reason = "no_tool_call"
        return False
    tool_msgs, done = [], False
    for call in calls:
        result = ep.env.step(call)
        tool_msgs.append(
            {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": str(result.observation)}
        )
        if turn.error_kind is None and result.error_kind is not None:
            turn.error_kind = result.error_kind
        if result.info:
            turn.extra.setdefault("info", []).append(result.info)
        if result.done:
            done = True
            break
    glue = turn_end_glue(tokenizer, ep.messages, ep.tools)
    delta = render_continuation(tokenizer, ep.messages, tool_msgs, ep.tools, add_generation_prompt=False)
    ep.builder.add("observation", _encode(tokenizer, glue + delta), msg_index + 1)
    ep.messages.extend(tool_msgs)
    if done:
        ep.stop_reason = "env_done"
        return False
    if len(ep.turns) >= config.max_turns:
        ep.stop_reason = "max_turns"
        return False
    _add_generation_prompt(tokenizer, ep, config.response_prefix)
    return True


def _finish(ep: _Episode) -> Rollout:
    outcome = dict(ep.env.finish())
    if "reward" not in outcome:
        raise CadenzaError(f"env for task {ep.task_id!r} returned an outcome without 'reward' from finish()")
    reward = float(outcome["reward"])
    versions = [int(t.extra.get("policy_version", 0)) for t in ep.turns]
    meta = {
        "task_id": ep.task_id,
        "stop_reason": ep.stop_reason or "context",
        "num_turns": len(ep.turns),
        "tools": ep.tools,
        "policy_version": min(versions, default=0),  # the oldest weights that sampled any of its tokens
    }
    tokens = ep.builder.build(messages=ep.messages, reward=reward, group_id=ep.group_id, metadata=meta)
    trajectory = Trajectory(
        task_id=ep.task_id,
        messages=ep.messages,
        turns=ep.turns,
        outcome=outcome,
        reward=reward,
        meta={
            "group_id": ep.group_id,
            "stop_reason": meta["stop_reason"],
            "policy_version": meta["policy_version"],
        },
    )
    return Rollout(tokens=tokens, trajectory=trajectory, outcome=outcome)
