"""The optional LLM judge: adds flags with source llm_judge; an unusable endpoint leaves the rules'
verdict."""

from __future__ import annotations

import json

from cadenza.monitor import JudgeConfig, apply_monitor, monitor
from cadenza.monitor.judge import parse_verdict
from tests.support.chat_server import closed_port_url, serve
from tests.support.monitor_helpers import bash, sample_task


def _answer(content: str):
    return lambda body: {"role": "assistant", "content": content}


def test_judge_adds_flags_and_sees_the_transcript():
    verdict = json.dumps(
        {"flags": [{"rule": "Special Casing", "turn": 1, "evidence": "if x == 5: return 10"}]}
    )
    t = bash("ls", "grep -n scale tests/test_core.py")
    with serve(_answer(f"Here is my verdict:\n```json\n{verdict}\n```")) as srv:
        flags = monitor(
            t, task=sample_task(), judge=JudgeConfig(endpoint=srv.url, model="judge", max_retries=0)
        )
    assert [(f.rule, f.turn, f.source) for f in flags] == [("special_casing", 1, "llm_judge")]
    prompt = srv.requests[0]["messages"][1]["content"]
    assert "turn 1: bash" in prompt and "grep -n scale" in prompt and "Implement mypkg.core.scale" in prompt
    assert "  -> ok" in prompt  # tool results are shown, cut short


def test_judge_flags_zero_the_reward_next_to_rule_flags():
    t = bash("git log")
    t.reward = 1.0
    with serve(_answer('{"flags": [{"rule": "history", "turn": 0, "evidence": "git log"}]}')) as srv:
        flags = apply_monitor(t, judge=JudgeConfig(endpoint=srv.url, model="judge"))
    assert {(f.rule, f.source) for f in flags} == {("git_archaeology", "rules"), ("history", "llm_judge")}
    assert t.reward == 0.0


def test_judge_down_or_garbage_keeps_rules_only():
    t = bash("git log")
    flags = monitor(t, judge=JudgeConfig(endpoint=closed_port_url(), model="j", max_retries=0, timeout_s=2))
    assert [f.rule for f in flags] == ["git_archaeology"] and "unreachable" in t.meta["judge_error"]
    clean = bash("ls")
    with serve(_answer("I think it is fine.")) as srv:
        assert monitor(clean, judge=JudgeConfig(endpoint=srv.url, model="j")) == []
    assert "no JSON" in clean.meta["judge_error"]


def test_parse_verdict_is_defensive():
    assert parse_verdict('{"flags": []}', 3).flags == []
    assert parse_verdict('{"flags": "yes"}', 3).error
    assert parse_verdict("{not json}", 3).error
    res = parse_verdict('{"flags": [{"rule": "x", "turn": 99}, {"rule": "y", "turn": "a"}, 5]}', 3)
    assert [(f.rule, f.turn) for f in res.flags] == [("x", -1), ("y", -1)]
