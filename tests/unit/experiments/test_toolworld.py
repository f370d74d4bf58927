"""toolworld semantics and the SFT corpus that sets up the tool-hint experiment."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from cadenza.agent.env import ToolCall
from cadenza.errors import ConfigError
from cadenza.experiments.corpus import corpus, tool_list_hint
from cadenza.experiments.toolworld import (
    PROFILES,
    Step,
    ToolworldConfig,
    ToolworldEnv,
    ToolworldTask,
    make_source,
)


def task(profile="beta"):
    return ToolworldTask(
        id="t",
        profile=profile,
        steps=(Step(operation="read", path="notes"), Step(operation="delete", path="log")),
    )


def test_episode_completes_only_with_the_profiles_tools():
    env = ToolworldEnv(task())
    msgs = env.reset()
    assert "beta" in msgs[-1]["content"] and "read_file" not in json.dumps(
        msgs
    )  # profile stated, tools not listed
    assert [t["function"]["name"] for t in env.tools()] == [
        "read_file",
        "write_file",
        "list_dir",
        "delete_file",
    ]
    r = env.step(ToolCall(name="view", arguments={"path": "notes"}))
    assert r.error_kind == "tool_not_found" and "view" in r.observation and "read_file" not in r.observation
    r = env.step(ToolCall(name="read_file", arguments='{"path": "notes"}'))
    assert r.error_kind is None and not r.done
    r = env.step(ToolCall(name="delete_file", arguments={"file": "log"}))
    assert r.error_kind == "invalid_arguments"
    r = env.step(ToolCall(name="delete_file", arguments={"path": "log"}))
    assert r.done and env.finish() == {
        "reward": 1.0,
        "resolved": True,
        "calls": 4,
        "invalid_tool_calls": 1,
        "remaining_steps": 0,
    }


def test_episode_is_cut_after_the_turn_budget_with_zero_reward():
    env = ToolworldEnv(task(), ToolworldConfig(extra_turns=1))
    results = [env.step(ToolCall(name="rm", arguments={"path": "log"})) for _ in range(3)]
    assert [r.done for r in results] == [False, False, True]
    assert env.finish()["reward"] == 0.0


def test_source_is_deterministic_and_rejects_bad_options():
    src = make_source({"min_steps": 2, "max_steps": 3})
    a = src.sample_tasks(random.Random(5), 6)
    assert a == src.sample_tasks(random.Random(5), 6)
    assert all(2 <= len(t.steps) <= 3 and t.profile in PROFILES for t in a)
    with pytest.raises(ConfigError, match="unknown toolworld option"):
        make_source({"max_stepz": 3})
    with pytest.raises(ConfigError, match="unknown profiles"):
        make_source({"profiles": ["delta"]})


def test_corpus_uses_listed_tools_when_listed_and_aliases_uniformly_otherwise():
    listed_ok = listed_total = 0
    unlisted = Counter()
    for msgs in corpus(seed=3, n=600):
        profile = msgs[1]["content"].split("Profile: ")[1].split(".")[0]
        listed = False
        for m in msgs:
            if m["role"] == "user" and m["content"].startswith("Reminder: the available tools are"):
                listed = True
            if m["role"] != "assistant":
                continue
            name = m["tool_calls"][0]["function"]["name"]
            if listed:
                listed_total += 1
                listed_ok += name in PROFILES[profile].values()
            else:
                unlisted[name in PROFILES[profile].values()] += 1
    assert listed_total > 200 and listed_ok == listed_total
    p_valid = unlisted[True] / (unlisted[True] + unlisted[False])
    assert abs(p_valid - 1 / len(PROFILES)) < 0.04  # uniform over the aliases
    env = ToolworldEnv(task("alpha"))
    assert tool_list_hint(env) == "Reminder: the available tools are view, create, ls, rm."
