"""The chat-completions client and the agent loop, against a local scripted chat server and a tiny Env."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from cadenza.agent.llm import ChatClient, LLMConfig, LLMError, parse_reply
from cadenza.agent.loop import NO_TOOL_CALL, LoopConfig, run_agent
from cadenza.errors import CadenzaError
from tests.support.chat_server import closed_port_url, scripted, serve, tool_call
from tests.support.llm_helpers import VLLM_CONTEXT_400, ReachFiveEnv


def client(url: str, **kw: Any) -> ChatClient:
    kw.setdefault("backoff_s", 0.01)
    kw.setdefault("timeout_s", 5.0)
    return ChatClient(LLMConfig(endpoint=url, model="m", **kw))


def test_tool_call_reply_round_trip():
    with serve(lambda body: tool_call("bash", command="ls")) as srv:
        reply = client(srv.url).complete(
            [{"role": "user", "content": "hi"}], tools=[{"type": "function", "function": {"name": "bash"}}]
        )
    call = reply.message["tool_calls"][0]
    assert call["function"]["name"] == "bash" and json.loads(call["function"]["arguments"]) == {
        "command": "ls"
    }
    sent = srv.requests[0]
    assert (
        sent["model"] == "m"
        and sent["tools"][0]["function"]["name"] == "bash"
        and sent["messages"][0]["content"] == "hi"
    )
    assert reply.usage["prompt_tokens"] == 10


def test_retries_on_503_then_succeeds():
    answers = iter([(503, b"busy"), (503, b"busy"), {"role": "assistant", "content": "ok"}])
    with serve(lambda body: next(answers)) as srv:
        reply = client(srv.url, max_retries=3).complete([{"role": "user", "content": "x"}])
    assert reply.message["content"] == "ok" and len(srv.requests) == 3


def test_retry_after_is_honoured():
    answers = iter([(429, b"slow down"), {"role": "assistant", "content": "ok"}])

    def policy(body):
        return next(answers)

    with serve(policy) as srv:
        srv.retry_after = "0.3"
        start = time.monotonic()
        reply = client(srv.url, max_retries=2).complete([])
        assert reply.message["content"] == "ok" and time.monotonic() - start >= 0.3


def test_tool_calls_left_in_text_are_recovered():
    text = 'Let me look.\n<tool_call>\n{"name": "view", "arguments": {"path": "calc/ops.py"}}\n</tool_call>'
    raw = json.dumps({"choices": [{"message": {"content": text}}]})
    msg = parse_reply(raw.encode()).message
    assert msg["tool_calls"][0]["function"] == {"name": "view", "arguments": '{"path": "calc/ops.py"}'}
    raw = json.dumps({"choices": [{"message": {"content": "<tool_call>{broken</tool_call>"}}]})
    assert "tool_calls" not in parse_reply(raw.encode()).message


def test_client_errors_are_not_retried():
    with (
        serve(lambda body: (400, b'{"error": {"message": "bad model"}}')) as srv,
        pytest.raises(LLMError, match=r"HTTP 400.*bad model") as info,
    ):
        client(srv.url, max_retries=3).complete([])
    assert info.value.kind == "http" and len(srv.requests) == 1


@pytest.mark.parametrize(
    "raw",
    [
        b"<html>oops</html>",
        b"[1, 2]",
        b'{"choices": []}',
        b'{"choices": [{"message": {"tool_calls": [{"function": {}}]}}]}',
    ],
)
def test_garbage_is_one_clear_error(raw):
    with serve(lambda body: (200, raw)) as srv, pytest.raises(LLMError) as info:
        client(srv.url).complete([])
    assert info.value.kind == "garbage" and "\n" not in str(info.value)


def test_endpoint_down_and_hung():
    with pytest.raises(LLMError, match="unreachable") as info:
        client(closed_port_url(), max_retries=1).complete([])
    assert info.value.kind == "unreachable"
    with serve(lambda body: ("sleep", 2.0)) as srv, pytest.raises(LLMError, match="unreachable"):
        client(srv.url, timeout_s=0.3, max_retries=0).complete([])


def test_config_validation():
    with pytest.raises(CadenzaError, match="not an http"):
        LLMConfig(endpoint="localhost:8000", model="m")
    assert LLMConfig(endpoint="http://h/v1/", model="m").url == "http://h/v1/chat/completions"
    assert LLMConfig(endpoint="http://h/v1/chat/completions", model="m").url == "http://h/v1/chat/completions"


def test_parse_reply_accepts_object_arguments():
    raw = json.dumps(
        {
            "choices": [
                {
                    "message": {
                        "content": None,
                        "tool_calls": [{"function": {"name": "view", "arguments": {"path": "a"}}}],
                    }
                }
            ]
        }
    )
    msg = parse_reply(raw.encode()).message
    assert json.loads(msg["tool_calls"][0]["function"]["arguments"]) == {"path": "a"}


def test_agent_loop_solves_counter_env():
    bad_args = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": "add", "arguments": "{not json"}}
        ],
    }
    script = [
        tool_call("add", n=2),
        {"role": "assistant", "content": "thinking..."},
        bad_args,
        tool_call("nope"),
        tool_call("add", n=3),
        tool_call("submit"),
    ]
    env = ReachFiveEnv()
    with serve(scripted(script)) as srv:
        traj = run_agent(env, client(srv.url), config=LoopConfig(max_turns=10), task_id="counter")
    assert env.finished and traj.reward == 1.0 and traj.outcome["resolved"]
    assert [t.tool for t in traj.turns] == ["add", None, "add", "nope", "add", "submit"]
    assert [t.error_kind for t in traj.turns] == [
        None,
        "no_tool_call",
        "invalid_arguments",
        "tool_not_found",
        None,
        None,
    ]
    assert env.calls[1].arguments == "{not json"  # malformed arguments reach the env as the raw string
    assert traj.flags == [] and "errored" not in traj.meta
    # The model saw every observation, in OpenAI format, in order.
    last = srv.requests[-1]["messages"]
    assert [m["role"] for m in last[:4]] == ["system", "user", "assistant", "tool"] and last[3][
        "content"
    ] == "2"
    assert sum(m["role"] == "tool" for m in last) == 4


def test_agent_loop_stops_at_max_turns():
    env = ReachFiveEnv()
    with serve(scripted([tool_call("add", n=1)])) as srv:
        traj = run_agent(env, client(srv.url), config=LoopConfig(max_turns=3))
    assert len(traj.turns) == 3 and env.finished and traj.reward == 0.0 and traj.meta["finished"] is False


def test_endpoint_garbage_mid_episode_marks_errored_and_finishes():
    script = [tool_call("add", n=5), (200, b"not json at all")]
    env = ReachFiveEnv()
    with serve(scripted(script)) as srv:
        traj = run_agent(env, client(srv.url, max_retries=1), config=LoopConfig(max_turns=10))
    assert env.finished and traj.meta["errored"] and "did not return JSON" in traj.meta["error"]
    assert traj.outcome == {"resolved": True, "reward": 1.0} and len(traj.turns) == 1


def test_loop_monitors_trajectories_of_plain_envs():
    env = ReachFiveEnv()
    script = [tool_call("add", n=5), tool_call("bash", command="git log -p"), tool_call("submit")]
    with serve(scripted(script)) as srv:
        traj = run_agent(env, client(srv.url))
    assert traj.outcome["resolved"] and traj.reward == 0.0
    assert [(f.rule, f.turn) for f in traj.flags] == [("git_archaeology", 1)]


def test_context_overflow_ends_the_episode_as_context_and_grades_it():
    """vLLM's HTTP 400 'maximum context length' is the end of the conversation, not an endpoint failure."""
    script = [tool_call("add", n=5), (400, VLLM_CONTEXT_400)]
    env = ReachFiveEnv()
    with serve(scripted(script)) as srv:
        traj = run_agent(env, client(srv.url, max_retries=3), config=LoopConfig(max_turns=10))
        assert len(srv.requests) == 2  # not retried
    assert env.finished and traj.outcome == {"resolved": True, "reward": 1.0}  # graded like any other
    assert traj.meta["stop_reason"] == "context" and "errored" not in traj.meta and len(traj.turns) == 1


def test_other_400s_stay_errors():
    env = ReachFiveEnv()
    with serve(scripted([(400, b'{"message": "bad tool schema"}')])) as srv:
        traj = run_agent(env, client(srv.url), config=LoopConfig(max_turns=3))
    assert traj.meta["errored"] and "bad tool schema" in traj.meta["error"] and "stop_reason" not in traj.meta


def test_no_tool_call_rule_end_makes_the_message_the_final_answer():
    """The same script under the two rules: ``nudge`` answers the message-only turn and goes on,
    ``end`` stops there (graded as it stands), as training's default does."""
    script = [tool_call("add", n=5), {"role": "assistant", "content": "done, I think"}, tool_call("submit")]
    nudged, ended = ReachFiveEnv(), ReachFiveEnv()
    with serve(scripted(script)) as srv:
        a = run_agent(nudged, client(srv.url), config=LoopConfig(max_turns=10, no_tool_call="nudge"))
    with serve(scripted(script)) as srv:
        b = run_agent(ended, client(srv.url), config=LoopConfig(max_turns=10, no_tool_call="end"))
        assert len(srv.requests) == 2  # nothing asked after the final answer
    assert [t.tool for t in a.turns] == ["add", None, "submit"] and a.outcome["resolved"]
    assert a.messages[5] == {"role": "user", "content": NO_TOOL_CALL}
    assert [t.tool for t in b.turns] == ["add", None] and ended.finished and b.outcome["resolved"]
    assert b.meta["finished"] is True and [c.name for c in ended.calls] == ["add"]
    with pytest.raises(CadenzaError, match="no_tool_call"):
        LoopConfig(no_tool_call="ignore")
