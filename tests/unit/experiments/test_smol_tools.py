"""The pieces of the SmolLM2 tool-hint setting: list-form tool calls, the forced call prefix, schemas in the
system message, trainable layers, and the CLI's bad-input rules (one line, before any work)."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest
import torch

from cadenza.errors import CadenzaError
from cadenza.experiments.smol_tools import SmolConfig, check_arms
from cadenza.experiments.study import check_settings
from cadenza.experiments.toolworld import (
    CALL_OPEN,
    PROFILES,
    ToolworldConfig,
    ToolworldEnv,
    ToolworldSource,
    call_text,
    sample_task,
)
from cadenza.rl.engines.policy import HFPolicy, tiny_qwen3_config
from cadenza.rl.rollout.loop import RolloutParams, RolloutTask, rollout
from cadenza.rl.text.chat import parse_tool_calls
from cadenza.rl.train.build import freeze_all_but_last
from tests.support.rl_helpers import ScriptedPolicy, make_tokenizer


def test_parse_list_form_calls():
    text = (
        '<tool_call>[{"name": "a", "arguments": {"p": 1}}, '
        '{"name": "b", "arguments": "{\\"q\\": 2}"}]</tool_call>'
    )
    calls = parse_tool_calls(text)
    assert [(c.name, c.arguments, c.id) for c in calls] == [
        ("a", {"p": 1}, "call_0"),
        ("b", {"q": 2}, "call_1"),
    ]
    assert parse_tool_calls("<tool_call>[]</tool_call>") == []  # "no call needed"
    # a list cut off by the token limit: its first call is salvaged (name, and the arguments object)
    [cut] = parse_tool_calls('<tool_call>[{"name": "view", "arguments": {"path": "x"}}')
    assert (cut.name, cut.arguments) == ("view", {"path": "x"})
    # the Hermes form is unchanged
    [one] = parse_tool_calls('<tool_call>\n{"name": "ls", "arguments": {"path": "src"}}\n</tool_call>')
    assert (one.name, one.arguments, one.id) == ("ls", {"path": "src"}, "call_0")


def test_schemas_in_the_system_message_and_the_call_text_round_trip():
    cfg = ToolworldConfig(min_steps=1, max_steps=1, extra_turns=0, tools_prompt="system")
    env = ToolworldEnv(sample_task(random.Random(3), cfg), cfg)
    system = env.reset()[0]["content"]
    names = list(PROFILES[env.task.profile].values())
    assert all(f'"name": "{n}"' in system for n in names) and "<tools>" in system
    assert "<tools>" not in ToolworldEnv(env.task).reset()[0]["content"]  # the toy setting shows none
    step = env.task.steps[0]
    name, args = env.correct_call(step)
    text = call_text(name, args)
    assert text.startswith(CALL_OPEN)
    [call] = parse_tool_calls(text)
    result = env.step(call)
    assert result.error_kind is None and env.finish()["resolved"]
    # the probe's target is that text (the template renders assistant content only)
    [item] = ToolworldSource(config=cfg).probe_items(1, seed=0)
    assert item.target["content"].startswith(CALL_OPEN) and "tool_calls" not in item.target
    with pytest.raises(Exception, match="tools_prompt"):
        ToolworldConfig(tools_prompt="template").validate()


def test_response_prefix_is_prompt_and_parsed_with_the_sampled_text():
    tok = make_tokenizer()
    prefix = '<tool_call>\n{"name": "'
    pol = ScriptedPolicy(tok, ['ad", "arguments": {"x": 1}}\n</tool_call>'])
    from tests.support.rl_helpers import CounterEnv

    [r] = rollout(
        pol,
        tok,
        [RolloutTask(task_id="t", make_env=CounterEnv)],
        RolloutParams(group_size=1, max_turns=1, response_prefix=prefix, max_new_tokens=256),
    )
    [turn] = r.trajectory.turns
    assert turn.tool == "ad" and turn.error_kind == "tool_not_found"
    start, _ = r.tokens.turn_spans[0]
    before = tok.decode(r.tokens.input_ids[:start], skip_special_tokens=False)
    assert before.endswith("<|im_start|>assistant\n" + prefix)  # the prefix is prompt, not sampled
    assert not any(r.tokens.loss_mask[:start])
    assert r.trajectory.messages[turn.message_index]["tool_calls"][0]["function"]["name"] == "ad"


def test_trainable_layers_freeze_all_but_the_last():
    tok = make_tokenizer()
    policy = HFPolicy.from_config(tiny_qwen3_config(len(tok), num_hidden_layers=3), seed=0)
    names = freeze_all_but_last(policy.model, 1)
    assert names and all(n.startswith(("model.layers.2.", "model.norm.")) for n in names)
    assert any(n.startswith("model.norm.") for n in names)
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    opt = torch.optim.AdamW([p for p in policy.model.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.tensor([tok.encode("Reminder: the available tools are add, submit.")])
    loss = policy.model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    changed = {n for n, p in policy.model.named_parameters() if not torch.equal(p, before[n])}
    assert changed == set(names)  # only the last layer and the final norm moved
    with pytest.raises(CadenzaError, match=r"trainable_layers = 4.*3 decoder layers"):
        freeze_all_but_last(policy.model, 4)


def test_train_config_of_the_setting_validates(tmp_path):
    from cadenza.rl.config import validate

    tok = make_tokenizer()
    tok.save_pretrained(str(tmp_path / "m"))
    exp = SmolConfig()
    cfg = exp.train_config("grpo_sd", 0, tmp_path / "m", tmp_path / "run", 6)
    cfg.model.path = ""  # random init from the tokenizer: validation without a checkpoint
    validate(cfg)
    assert cfg.model.trainable_layers == 4 and cfg.rollout.response_prefix == CALL_OPEN
    assert cfg.env.options["tools_prompt"] == "system" and cfg.rollout.max_turns == 1
    assert cfg.teacher.weights == "frozen" and cfg.loss.lambda_sd == 1.0
    assert exp.train_config("grpo", 0, tmp_path, tmp_path, 6).loss.lambda_sd == 0.0
    assert exp.train_config("placebo", 0, tmp_path, tmp_path, 6).feedback.placebo is True
    assert check_arms(["placebo", "grpo"]) == ["grpo", "placebo"]
    for bad in (["supervised"], ["grpo", "grpo"], []):
        with pytest.raises(CadenzaError, match="--arms"):
            check_arms(bad)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cadenza", "experiment", "smol-tools", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow  # resolves the offline SmolLM2 model, which `make test` installs (not `make test-fast`)
def test_cli_bad_input_is_one_line_before_any_work(tmp_path):
    held = tmp_path / "held"
    check_settings(held, SmolConfig.quick())  # type: ignore[arg-type]
    cases = [
        (["--seeds", "x"], "--seeds"),
        (["--arms", "grpo,sd"], "--arms"),
        (["--workers", str((os.cpu_count() or 1) + 1)], "--workers"),
        (["--steps", "-2"], "--steps"),
        (["--model", str(tmp_path / "nope")], "--model"),
    ]
    for i, (args, needle) in enumerate(cases):
        out = tmp_path / f"out{i}"
        proc = _cli("--out", str(out), "--quick", *args)
        err = proc.stderr.strip()
        assert proc.returncode == 2 and len(err.splitlines()) == 1 and needle in err, (args, err)
        assert "Traceback" not in err and not out.exists()
    proc = _cli("--out", str(held), "--quick", "--seeds", "0,1")
    err = proc.stderr.strip()
    assert proc.returncode == 2 and len(err.splitlines()) == 1 and "other settings" in err, err
    assert sorted(p.name for p in held.iterdir()) == ["settings.json"]
