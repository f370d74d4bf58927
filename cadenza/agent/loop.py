"""The agent loop, one for evaluation and training: an episode drives any :class:`Env` on its own clock.

One turn: the :class:`Agent` generates (``act``), each tool call it made runs in the episode's env,
the answers go back to the agent (``observe``), until the env says done, the turn budget is spent, or
the agent stops (context full, endpoint failed). The loop knows nothing of tokens or torch:
``cadenza eval`` drives it with :class:`ChatAgent` (an OpenAI chat endpoint), training rollouts with
the token-level agent of :mod:`cadenza.rl.rollout.loop`. Episodes run this loop concurrently, one thread
each, so one episode's tool call never waits for another's generation (:func:`run_episodes`).

**A turn without a tool call** is decided by one rule, ``LoopConfig.no_tool_call``:

* ``"nudge"`` (evaluation's default): the env answers it (an :class:`~cadenza.agent.episode.Episode`
  records the turn and its budget, others get :data:`NO_TOOL_CALL`) as a user message, and the episode
  continues;
* ``"end"`` (training's default, ``rollout.no_tool_call``): the message is the final answer and the
  episode ends, graded as it stands.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

from cadenza.agent.env import Env, StepResult, ToolCall
from cadenza.agent.llm import ChatClient, LLMContextError, LLMError
from cadenza.agent.trajectory import Trajectory
from cadenza.errors import CadenzaError

NO_TOOL_CALL = "Error: no tool call found. Call one of the tools; call submit when done."
NO_TOOL_CALL_RULES = ("nudge", "end")
T = TypeVar("T")


@dataclass(kw_only=True)
class LoopConfig:
    max_turns: int = 30  # assistant messages the model may send
    # a turn without a tool call: nudge = the env answers it and the episode goes on; end = final answer
    no_tool_call: Literal["nudge", "end"] = "nudge"

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise CadenzaError(f"max_turns must be >= 1, got {self.max_turns}")
        if self.no_tool_call not in NO_TOOL_CALL_RULES:
            raise CadenzaError(
                f"no_tool_call = {self.no_tool_call!r}; use one of {', '.join(NO_TOOL_CALL_RULES)}"
            )


@dataclass(kw_only=True)
class Act:
    """One generated turn. ``stop`` ("context", "error") ends the episode before any env step."""

    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    stop: str = ""
    error: str | None = None
    # keyword arguments for an env that records the assistant message itself (Episode): one per call,
    # or one for ``respond`` when there is no call; empty = the plain Env protocol
    env_kwargs: list[dict[str, Any]] = field(default_factory=list)


class Agent(Protocol):
    def act(self) -> Act:
        """Generate the next turn from the conversation so far."""

    def observe(self, act: Act, results: Sequence[StepResult], seconds: Sequence[float]) -> None:
        """Record the env's answers to ``act`` (one per call run; one nudge when it made none; none when
        the episode ends on it)."""


@dataclass(kw_only=True)
class LoopResult:
    stop_reason: str  # env_done | max_turns | no_tool_call | context | error
    turns: int
    error: str | None = None


def run_loop(env: Env, agent: Agent, config: LoopConfig, *, tool_slots: Any = None) -> LoopResult:
    """One episode to its end (the env is reset by the caller and finished by it). ``tool_slots``
    (a semaphore) bounds how many episodes run env calls at once."""
    slots = tool_slots if tool_slots is not None else nullcontext()
    for turn in range(config.max_turns):
        act = agent.act()
        if act.stop:
            return LoopResult(stop_reason=act.stop, turns=turn, error=act.error)
        results: list[StepResult] = []
        seconds: list[float] = []
        if not act.calls and config.no_tool_call == "end":
            agent.observe(act, results, seconds)
            return LoopResult(stop_reason="no_tool_call", turns=turn + 1)
        with slots:
            if not act.calls:
                t0 = time.monotonic()
                respond = getattr(env, "respond", None)
                kw = act.env_kwargs[0] if act.env_kwargs else {}
                result = (
                    respond(act.content, **kw)
                    if callable(respond)
                    else StepResult(observation=NO_TOOL_CALL, done=False, error_kind="no_tool_call")
                )
                results.append(result)
                seconds.append(time.monotonic() - t0)
            for i, call in enumerate(act.calls):
                t0 = time.monotonic()
                results.append(env.step(call, **act.env_kwargs[i]) if act.env_kwargs else env.step(call))
                seconds.append(time.monotonic() - t0)
                if results[-1].done:
                    break
        agent.observe(act, results, seconds)
        if any(r.done for r in results):
            return LoopResult(stop_reason="env_done", turns=turn + 1)
    return LoopResult(stop_reason="max_turns", turns=config.max_turns)


def run_episodes(jobs: Sequence[Callable[[], T]], concurrency: int) -> list[T]:
    """Run each episode job on its own thread (at most ``concurrency`` at once); results in job order.
    Every job runs to its end even when another fails; the first failure is raised after all."""
    if not jobs:
        return []
    with ThreadPoolExecutor(
        max_workers=max(1, min(concurrency, len(jobs))), thread_name_prefix="episode"
    ) as ex:
        futures = [ex.submit(job) for job in jobs]
        errors = [f.exception() for f in futures]
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    return [f.result() for f in futures]


def _arguments(raw: Any) -> dict[str, Any] | str:
    """Tool arguments as the environment expects: a dict, or the raw string when it is not a JSON object."""
    if isinstance(raw, dict):
        return raw
    try:
        val = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:
        return str(raw)
    return val if isinstance(val, dict) else str(raw)


class ChatAgent:
    """An OpenAI chat endpoint as the loop's agent (``cadenza eval``): keeps the conversation, usage,
    time in the model; records its own trajectory when the env does not (``record``)."""

    def __init__(
        self, client: ChatClient, env: Env, messages: list[dict[str, Any]], *, record: Trajectory | None
    ):
        self.client, self.env, self.tools = client, env, env.tools()
        self.convo: list[dict[str, Any]] = [dict(m) for m in messages]
        self.own = record
        self.rich = record is None
        self.usage = {"prompt_tokens": 0, "completion_tokens": 0}
        self.llm_s = 0.0
        self._msg: dict[str, Any] = {}
        self._tool_calls: list[dict[str, Any]] = []

    def act(self) -> Act:
        try:
            reply = self.client.complete(self.convo, self.tools)
        except LLMContextError:  # the conversation outgrew the server's window: over, not broken
            if getattr(self.env, "end_reason", "") is None:
                self.env.end_reason = "context"  # type: ignore[attr-defined]
            return Act(stop="context")
        except LLMError as exc:
            return Act(stop="error", error=str(exc))
        self.llm_s += reply.latency_s
        for k in self.usage:
            self.usage[k] += int(reply.usage.get(k) or 0)
        msg = self._msg = reply.message
        self._tool_calls = list(msg.get("tool_calls") or [])
        self.convo.append(msg)
        calls = [
            ToolCall(name=tc["function"]["name"], arguments=_arguments(tc["function"].get("arguments", "{}")),
                     id=tc.get("id") or f"call_{i}")
            for i, tc in enumerate(self._tool_calls)
        ]  # fmt: skip
        completion = int(reply.usage.get("completion_tokens") or 0)
        content = msg.get("content") or ""
        kwargs: list[dict[str, Any]] = []
        if self.rich:  # the message's content and token count go with its first call (or its nudge)
            kwargs = [dict(content=content, tokens=completion)] if not calls else [
                dict(content=msg.get("content") if i == 0 else None, tokens=completion if i == 0 else 0)
                for i in range(len(calls))
            ]  # fmt: skip
        return Act(content=content, calls=calls, env_kwargs=kwargs)

    def observe(self, act: Act, results: Sequence[StepResult], seconds: Sequence[float]) -> None:
        if not act.calls and not results:  # the final answer (rule "end"): a turn with nothing to answer
            if self.own is not None:
                self.own.add_turn(self._msg)
            return
        if not act.calls:
            for r in results:
                self.convo.append({"role": "user", "content": r.observation})
                if self.own is not None:
                    self.own.add_turn(self._msg, error_kind="no_tool_call")
                    self.own.messages.append({"role": "user", "content": r.observation})
            return
        for i, (call, r, dt) in enumerate(zip(act.calls, results, seconds, strict=False)):
            self.convo.append({"role": "tool", "tool_call_id": call.id, "content": r.observation})
            if self.own is not None:
                content = self._msg.get("content") if i == 0 else None
                sent = {"role": "assistant", "content": content, "tool_calls": [self._tool_calls[i]]}
                self.own.add_turn(sent, tool=call.name, arguments=call.argument_dict(),
                                  error_kind=r.error_kind, exit_code=r.info.get("exit_code"),
                                  duration_s=dt)  # fmt: skip
                self.own.messages.append({"role": "tool", "tool_call_id": call.id, "content": r.observation})


def run_agent(
    env: Env,
    client: ChatClient,
    *,
    config: LoopConfig | None = None,
    task_id: str = "",
    tool_slots: threading.Semaphore | None = None,
) -> Trajectory:
    """Run one episode; the returned trajectory carries outcome, reward, flags and ``meta`` timings."""
    config = config or LoopConfig()
    start = time.monotonic()
    messages = env.reset()
    rich = hasattr(env, "respond")  # Episode: records its own trajectory
    own = Trajectory(task_id=task_id, messages=[dict(m) for m in messages])
    agent = ChatAgent(client, env, messages, record=None if rich else own)
    res = run_loop(env, agent, config, tool_slots=tool_slots)
    acted = len(agent.convo) > len(messages)
    if res.error is not None and not acted and callable(getattr(env, "close", None)):
        # The model never answered: nothing to grade, so skip the test run and just release the workspace.
        env.close()  # type: ignore[attr-defined]
        outcome = {"resolved": False, "reward": 0.0, "turns": 0, "flags": [], "end_reason": "error"}
    else:
        outcome = env.finish()
    traj = getattr(env, "trajectory", None) if rich else None
    if isinstance(traj, Trajectory) and traj.outcome is None:
        traj.outcome, traj.reward = outcome, 0.0
    if not isinstance(traj, Trajectory):
        traj = own
        traj.outcome = outcome
        traj.reward = float(outcome.get("reward", 0.0))
        from cadenza.monitor import apply_monitor

        apply_monitor(traj, task=getattr(env, "task", None))
    traj.task_id = traj.task_id or task_id
    finished = res.stop_reason in ("env_done", "no_tool_call")
    traj.meta.update({"llm_s": agent.llm_s, "wall_s": time.monotonic() - start, "usage": agent.usage,
                      "finished": finished})  # fmt: skip
    if res.stop_reason == "context":
        traj.meta["stop_reason"] = "context"
    if res.error is not None:
        traj.meta["errored"] = True
        traj.meta["error"] = res.error
    return traj
