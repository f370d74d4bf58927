"""Rollouts: drive any :class:`cadenza.agent.env.Env` with a :class:`Policy`, G samples per task.

Each episode runs the one agent loop (:func:`cadenza.agent.loop.run_loop`) on its own thread, through
:class:`TokenAgent`: it generates a turn, runs the tool calls in its env, and asks for its next turn,
on its own clock. The turns that are waiting at once reach the engine as one batch
(:class:`~cadenza.rl.turn_batcher.TurnBatcher`: continuous batching across episodes and turns); tool
calls of different episodes run concurrently, at most ``rollout.tool_workers`` at a time. Every turn
carries its own seed (from the rollout seed, the episode and the turn), so a sample does not depend on
which batch carried it, up to the engine's numerics. The in-process ``hf`` engine's numerics do depend
on the batch (padding, matmul blocking), so with it every batch holds every live episode's next turn,
in episode order: runs are bit-identical whatever the timing, and only the tool calls overlap.
``rollout.schedule = "lockstep"`` (the old loop: every turn waits for the slowest episode, tools one
after another) is kept for comparison.

Each episode becomes a :class:`TokenTrajectory` (exact sampled ids + behaviour log-probs;
prompt/observation tokens from incremental chat-template rendering) and a cadenza
:class:`Trajectory` (OpenAI messages, one ``TurnMeta`` per model turn with ``token_ids``/``logprobs``
filled), plus the env's outcome reward.

A turn without a tool call follows ``rollout.no_tool_call``: ``end`` (default: it is the final answer)
or ``nudge`` (the env answers it and the episode goes on), the rule :mod:`cadenza.agent.loop`
documents. An episode also ends on ``done`` from the env, ``max_turns``, and running out of context
(``max_context_tokens``, or the engine's own window: a :class:`Sample` with ``finish_reason ==
"context"`` or :class:`ContextLengthExceeded` from the engine, which ends only that episode), all
graded alike. Every turn records the policy version that sampled it (``TurnMeta.extra``); the
trajectory's ``meta["policy_version"]`` is the oldest of them (what staleness is measured from).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cadenza.agent.env import Env, NoToolsView, StepResult
from cadenza.agent.loop import Act, LoopConfig, run_episodes, run_loop
from cadenza.agent.trajectory import Trajectory, TurnMeta
from cadenza.errors import CadenzaError
from cadenza.rl.config import RolloutParams
from cadenza.rl.engines.policy import Policy, SamplingParams
from cadenza.rl.rollout.longtail import CutCounts, GroupRace
from cadenza.rl.rollout.turn_batcher import EpisodeCut, TurnBatcher
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
    episode: int = 0  # its index among the rollout's episodes (task-major)

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


def turn_seed(seed: int, episode: int, turn: int) -> int:
    """The sampling seed of one turn: a function of the rollout seed, the episode and the turn only."""
    digest = hashlib.sha256(f"{seed}/{episode}/{turn}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 2


def rollout(
    policy: Policy,
    tokenizer: Any,
    tasks: Sequence[RolloutTask],
    config: RolloutParams,
    *,
    seed: int = 0,
    on_episode_done: Callable[[int, int], None] | None = None,
    group_offset: int = 0,
    finish_groups: int = 0,
    cut: CutCounts | None = None,
) -> list[Rollout]:
    """Roll out ``config.group_size`` episodes per task; results are ordered task by task.

    ``config`` is the run's ``[rollout]`` (a :class:`~cadenza.rl.config.RolloutConfig` is one) or a
    bare :class:`RolloutParams`; ``seed`` seeds every turn's sampling (:func:`turn_seed`; the trainer
    derives it from the run seed and the step).
    ``group_id`` of every sample of ``tasks[i]`` is ``f"{group_offset + i}:{task_id}"`` (GRPO groups;
    the offset keeps ids unique when one step's tasks are rolled out in separate units).
    ``on_episode_done(finished, total)`` is called as episodes end (for progress bars).
    ``finish_groups`` (long-tail control, :mod:`cadenza.rl.rollout.longtail`): return once that many
    tasks' groups have finished, cutting the others whole (0, or all tasks: no cut); what was cut is
    added to ``cut``.
    """
    require_chat_template(tokenizer)
    eos = tokenizer.eos_token_id
    if eos is None:
        raise CadenzaError("the tokenizer has no eos token; set tokenizer.eos_token to the end-of-turn token")
    if not tasks:
        raise CadenzaError("no tasks to roll out")
    episodes = [
        _start(tokenizer, task, f"{group_offset + i}:{task.task_id}", config.response_prefix)
        for i, task in enumerate(tasks)
        for _ in range(config.group_size)
    ]
    lockstep = config.schedule == "lockstep"
    # an engine whose samples depend on the batch they run in (``fixed_batches``: the in-process hf
    # engine) gets batches of every live episode, in order: bit-identical runs whatever the timing; its
    # episodes' tool calls still overlap
    fixed = lockstep or bool(getattr(policy, "fixed_batches", False))
    auto = 1 if getattr(policy, "name", "hf") == "hf" else 8
    inflight = 1 if fixed else (config.inflight_batches or auto)
    batcher = TurnBatcher(policy, len(episodes), lockstep=fixed, inflight=inflight)
    slots = threading.Semaphore(1 if lockstep else config.tool_workers)
    loop = LoopConfig(max_turns=config.max_turns, no_tool_call=config.no_tool_call)
    count = threading.Lock()
    finished = [0]

    race = GroupRace(len(tasks), config.group_size, finish_groups) if 0 < finish_groups < len(tasks) else None

    def run(k: int) -> Rollout | None:
        ep = episodes[k]
        agent = TokenAgent(tokenizer, ep, batcher, config, seed=seed, index=k)
        try:
            ep.stop_reason = run_loop(ep.env, agent, loop, tool_slots=slots).stop_reason
        finally:
            batcher.leave()
        if race is not None and race.is_cut(k // config.group_size):
            _close(ep.env)  # cut: not graded, not trained on
            return None
        with slots:  # grading runs in the env's sandbox: one of the bounded tool slots
            done = _finish(ep)
            done.episode = k
        with count:
            finished[0] += 1
            if on_episode_done is not None:
                on_episode_done(finished[0], len(episodes))
        return done

    jobs = [lambda k=k: run(k) for k in range(len(episodes))]
    if race is None:
        try:
            return run_episodes(jobs, len(episodes))
        finally:
            batcher.close()
    try:
        kept, counts = race.run(jobs, batcher.abandon)
    finally:  # an in-process engine's batch in flight ends first: it shares the trainer's model
        batcher.close(None if fixed else 0)
    if cut is not None:
        cut.groups_cut += counts.groups_cut
        cut.episodes_cut += counts.episodes_cut
    return kept


def _close(env: Env) -> None:
    """Release a cut episode's env (its sandbox) without grading it."""
    inner = env.env if isinstance(env, NoToolsView) else env
    close = getattr(inner, "close", None)
    if callable(close):
        close()


class TokenAgent:
    """The loop's agent for training: token-exact turns sampled through a :class:`TurnBatcher`."""

    def __init__(
        self,
        tokenizer: Any,
        ep: _Episode,
        batcher: TurnBatcher,
        config: RolloutParams,
        *,
        seed: int,
        index: int,
    ) -> None:
        self.tokenizer, self.ep, self.batcher, self.config = tokenizer, ep, batcher, config
        self.seed, self.index = seed, index
        self._need_prompt = False  # _start added the first generation prompt

    def act(self) -> Act:
        tok, ep, config = self.tokenizer, self.ep, self.config
        if self._need_prompt:
            _add_generation_prompt(tok, ep, config.response_prefix)
            self._need_prompt = False
        budget = config.max_context_tokens - len(ep.builder)
        if budget < 1:
            return Act(stop="context")
        params = SamplingParams(
            max_new_tokens=min(config.max_new_tokens, budget),
            temperature=config.temperature,
            top_k=config.top_k,
            stop_token_ids=(int(tok.eos_token_id),),
        )
        try:
            sample = self.batcher.sample(
                ep.builder.input_ids, params, turn_seed(self.seed, self.index, len(ep.turns)), key=self.index
            )
        except EpisodeCut:  # long-tail control: its step has enough finished groups
            return Act(stop="cut")
        if sample.finish_reason == "context":  # the engine's context window is full: graded as is
            return Act(stop="context")
        ids, lps, finish = sample.token_ids, sample.logprobs, sample.finish_reason
        if len(ids) > budget:  # this episode's context is nearly full: keep what fits (a prefix is a sample)
            ids, lps, finish = ids[:budget], lps[:budget], "length"
        text, calls = _record_turn(tok, ep, ids, lps, finish, config, sample.policy_version)
        return Act(content=text, calls=calls)

    def observe(self, act: Act, results: Sequence[StepResult], seconds: Sequence[float]) -> None:
        if not results:
            return  # the episode ends on this turn
        tok, ep, turn = self.tokenizer, self.ep, self.ep.turns[-1]
        if act.calls:
            msgs = [{"role": "tool", "tool_call_id": c.id, "name": c.name, "content": str(r.observation)}
                    for c, r in zip(act.calls, results, strict=False)]  # fmt: skip
        else:  # nudged: the env's answer to a turn without a tool call
            msgs = [{"role": "user", "content": str(results[0].observation)}]
        for result in results:
            if turn.error_kind is None and result.error_kind is not None:
                turn.error_kind = result.error_kind
            if result.info:
                turn.extra.setdefault("info", []).append(result.info)
        glue = turn_end_glue(tok, ep.messages, ep.tools)
        delta = render_continuation(tok, ep.messages, msgs, ep.tools, add_generation_prompt=False)
        ep.builder.add("observation", _encode(tok, glue + delta), len(ep.messages))
        ep.messages.extend(msgs)
        self._need_prompt = True


def _record_turn(
    tokenizer: Any,
    ep: _Episode,
    ids: list[int],
    logprobs: list[float],
    finish_reason: str,
    config: RolloutParams,
    policy_version: int = 0,
) -> tuple[str, list[Any]]:
    """Record one sampled turn (tokens, message, ``TurnMeta``); return its text and tool calls."""
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
    ep.messages.append(assistant_message(text, calls))
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
    return text, calls


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
