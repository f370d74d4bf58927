"""The agent loop: a chat model drives any :class:`~cadenza.agent.env.Env` through tool calls.

Short on purpose (mini-swe-agent style): ask the model, execute each tool call it made, append
the observations, stop when the environment says done or the turn budget is spent. When the
endpoint fails mid-episode the trajectory is marked ``errored`` and the episode still finishes,
so one bad server answer never loses the run. Environments that keep their own trajectory
(:class:`cadenza.agent.episode.Episode`) are used as they are; for others the loop records one
and runs the monitor itself.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from cadenza.agent.env import Env, StepResult, ToolCall
from cadenza.agent.llm import ChatClient, LLMContextError, LLMError
from cadenza.agent.trajectory import Trajectory

NO_TOOL_CALL = "Error: no tool call found. Call one of the tools; call submit when done."


@dataclass(kw_only=True)
class LoopConfig:
    max_turns: int = 30  # assistant messages the model may send


def _arguments(raw: Any) -> dict[str, Any] | str:
    """Tool arguments as the environment expects: a dict, or the raw string when it is not a JSON object."""
    if isinstance(raw, dict):
        return raw
    try:
        val = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:
        return str(raw)
    return val if isinstance(val, dict) else str(raw)


def run_agent(
    env: Env, client: ChatClient, *, config: LoopConfig | None = None, task_id: str = ""
) -> Trajectory:
    """Run one episode; the returned trajectory carries outcome, reward, flags and ``meta`` timings."""
    config = config or LoopConfig()
    messages = env.reset()
    tools = env.tools()
    convo: list[dict[str, Any]] = [dict(m) for m in messages]
    own = Trajectory(task_id=task_id, messages=[dict(m) for m in messages])
    rich = hasattr(env, "respond")  # Episode: records its own trajectory, accepts the message content
    usage = {"prompt_tokens": 0, "completion_tokens": 0}
    error: str | None = None
    llm_s = 0.0
    start = time.monotonic()
    done = False
    stop_reason = ""
    for _ in range(config.max_turns):
        try:
            reply = client.complete(convo, tools)
        except LLMContextError:
            # The conversation outgrew the server's context window: the episode is over, not broken.
            stop_reason = "context"
            if getattr(env, "end_reason", "") is None:
                env.end_reason = "context"  # type: ignore[attr-defined]
            break
        except LLMError as exc:
            error = str(exc)
            break
        llm_s += reply.latency_s
        for k in usage:
            usage[k] += int(reply.usage.get(k) or 0)
        msg = reply.message
        calls = msg.get("tool_calls") or []
        convo.append(msg)
        if not calls:
            completion = int(reply.usage.get("completion_tokens") or 0)
            result = (
                env.respond(msg.get("content") or "", tokens=completion)
                if rich
                else StepResult(observation=NO_TOOL_CALL, done=False)
            )  # type: ignore[attr-defined]
            convo.append({"role": "user", "content": result.observation})
            if not rich:
                own.add_turn(msg, error_kind="no_tool_call")
                own.messages.append({"role": "user", "content": result.observation})
            done = result.done
        for i, tc in enumerate(calls):
            fn = tc["function"]
            call = ToolCall(
                name=fn["name"],
                arguments=_arguments(fn.get("arguments", "{}")),
                id=tc.get("id") or f"call_{i}",
            )
            t0 = time.monotonic()
            content = msg.get("content") if i == 0 else None  # the message's content goes with its first call
            if rich:  # and so does its token count
                result = env.step(
                    call,
                    content=content,  # type: ignore[call-arg]
                    tokens=int(reply.usage.get("completion_tokens") or 0) if i == 0 else 0,
                )
            else:
                result = env.step(call)
            convo.append({"role": "tool", "tool_call_id": call.id, "content": result.observation})
            if not rich:
                own.add_turn(
                    {"role": "assistant", "content": content, "tool_calls": [tc]},
                    tool=call.name,
                    arguments=call.argument_dict(),
                    error_kind=result.error_kind,
                    exit_code=result.info.get("exit_code"),
                    duration_s=time.monotonic() - t0,
                )
                own.messages.append({"role": "tool", "tool_call_id": call.id, "content": result.observation})
            if result.done:
                done = True
                break
        if done:
            break
    acted = len(convo) > len(messages)
    if error is not None and not acted and callable(getattr(env, "close", None)):
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
    traj.meta.update({"llm_s": llm_s, "wall_s": time.monotonic() - start, "usage": usage, "finished": done})
    if stop_reason:
        traj.meta["stop_reason"] = stop_reason
    if error is not None:
        traj.meta["errored"] = True
        traj.meta["error"] = error
    return traj
