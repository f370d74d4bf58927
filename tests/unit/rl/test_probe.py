"""The hint-following diagnostic: exact probabilities, and it catches an eroding live teacher (not a frozen
one)."""

from __future__ import annotations

import json

import pytest
import torch

from cadenza.errors import ConfigError
from cadenza.experiments.toolworld import PROFILES, ToolworldSource
from cadenza.rl.config import TeacherConfig
from cadenza.rl.engines.policy import HFPolicy, tiny_qwen3_config
from cadenza.rl.learn.probe import HintFollowingEroded, HintProbe, ProbeItem, ProbeSchedule, load_probe_file
from cadenza.rl.learn.sft import encode_messages
from cadenza.rl.learn.teacher import Teacher
from cadenza.rl.text.chat import render
from cadenza.rl.text.tokens import collate
from tests.support.rl_helpers import CounterEnv, make_tokenizer

HINT = "Reminder: the available tools are add, submit."


def call(name: str, args: dict) -> dict:
    fn = {"name": name, "arguments": json.dumps(args)}
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c0", "type": "function", "function": fn}],
    }


ADD, SUBMIT = call("add", {"x": 1}), call("submit", {})


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


def _model(tok):
    torch.manual_seed(0)
    return HFPolicy.from_config(
        tiny_qwen3_config(len(tok), hidden_size=32, intermediate_size=64, head_dim=8), seed=0
    )


def _ce_steps(policy, tok, examples, steps: int, lr: float) -> None:
    """Cross-entropy on the last assistant turn of each (messages, target) example."""
    opt = torch.optim.AdamW(policy.model.parameters(), lr=lr)
    trajs = [encode_messages(tok, [*m, t]) for m, t in examples]
    batch = collate(trajs, tok.pad_token_id)
    mask = torch.zeros_like(batch.loss_mask)
    for row, tr in enumerate(trajs):
        s, e = tr.turn_spans[-1]
        mask[row, s:e] = 1
    policy.model.train()
    for _ in range(steps):
        logits = policy.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
        lp = torch.log_softmax(logits.float(), -1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]
        loss = -(lp * mask[:, 1:]).sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_probe_probability_equals_float64_reference(tok):
    pol = _model(tok)
    ctx = CounterEnv().reset()
    items = [
        ProbeItem(messages=ctx, hint=HINT, target=ADD),
        ProbeItem(messages=ctx[:1], hint="x", target=SUBMIT),
    ]
    probe = HintProbe(items, tok)
    ref64 = pol.model.double()
    for hinted in (True, False):
        want = []
        for it in items:
            msgs = it.messages + ([{"role": "user", "content": it.hint}] if hinted else [])
            ctx_text = render(tok, msgs, add_generation_prompt=True)
            ids = encode_messages(tok, [*msgs, it.target]).input_ids
            n_ctx = len(tok.encode(ctx_text, add_special_tokens=False))
            with torch.no_grad():
                lp = torch.log_softmax(ref64(input_ids=torch.tensor([ids])).logits[0], -1)
            want.append(float(torch.exp(sum(lp[t - 1, ids[t]] for t in range(n_ctx, len(ids))))))
        got = probe.probability(ref64, hinted)
        assert got == pytest.approx(sum(want) / len(want), rel=1e-9, abs=1e-12)


def test_diagnostic_fires_for_an_eroding_live_teacher_and_not_for_a_frozen_one(tok):
    ctx = CounterEnv().reset()
    hinted_ctx = [*ctx, {"role": "user", "content": HINT}]
    probe = HintProbe([ProbeItem(messages=ctx, hint=HINT, target=ADD)], tok)
    results = {}
    for weights in ("live", "frozen"):
        pol = _model(tok)
        # warm-up: with the hint the model calls add; without it, it calls add too (a weaker habit)
        _ce_steps(pol, tok, [(hinted_ctx, ADD), (ctx, ADD)], steps=100, lr=1e-2)
        teacher = Teacher(pol.model, TeacherConfig(weights=weights))
        sched = ProbeSchedule(probe, every=2, stop_ratio=0.5)
        rows, fired = [], None
        # scripted erosion: training moves only the un-hinted context (here toward submit); the shared
        # weights carry the change into the hinted context as well
        for step in range(14):
            row = sched.measure(step, pol.model, teacher.model)
            if row:
                rows.append(row)
                try:
                    sched.check(row)
                except HintFollowingEroded as exc:
                    fired = (step, str(exc))
                    break
            _ce_steps(pol, tok, [(ctx, SUBMIT)], steps=1, lr=1e-3)
            teacher.update(pol.model, step=step + 1)
        results[weights] = (rows, fired)
    live_rows, live_fired = results["live"]
    frozen_rows, frozen_fired = results["frozen"]
    assert live_rows[0]["probe_teacher_hinted"] > 0.8  # the warm model follows the hint
    assert live_rows[0] == frozen_rows[0]  # same start, same numbers
    assert live_fired is not None and "eroded" in live_fired[1], live_rows
    assert live_rows[-1]["probe_teacher_hinted"] < 0.5 * live_rows[0]["probe_teacher_hinted"]
    # the frozen teacher's numbers stay put while its student erodes exactly like the live one
    assert frozen_fired is None
    assert len({r["probe_teacher_hinted"] for r in frozen_rows}) == 1
    assert frozen_rows[-1]["probe_student_hinted"] < 0.5 * frozen_rows[0]["probe_student_hinted"]
    assert all(r["probe_weights_step"] % 2 == 0 for r in frozen_rows) and len(frozen_rows) == 7


def test_schedule_off_baseline_from_history_and_probe_file_errors(tok, tmp_path):
    assert ProbeSchedule(None, every=0).measure(0, None, None) == {}
    probe = HintProbe([ProbeItem(messages=CounterEnv().reset(), hint=HINT, target=ADD)], tok)
    resumed = ProbeSchedule(
        probe, every=1, stop_ratio=0.9, history=[{"step": 1, "probe_teacher_hinted": 1.0}]
    )
    assert resumed.baseline == 1.0  # a resumed run compares against the first value of the whole run
    with pytest.raises(HintFollowingEroded):
        resumed.check(resumed.measure(3, _model(tok).model, _model(tok).model))
    bad = tmp_path / "probe.jsonl"
    bad.write_text('{"messages": []}\n')
    with pytest.raises(ConfigError, match=r"probe\.jsonl:1"):
        load_probe_file(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_probe_file(tmp_path / "missing.jsonl")
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"messages": CounterEnv().reset(), "hint": HINT, "target": ADD}) + "\n")
    assert load_probe_file(good)[0].target == ADD


def test_toolworld_probe_items_are_fixed_and_hold_the_correct_call():
    src = ToolworldSource()
    a, b = src.probe_items(8, seed=0), src.probe_items(8, seed=0)
    assert [x.messages for x in a] == [x.messages for x in b] and a[0].messages != src.probe_items(8, 1)[
        0
    ].messages
    for it in a:
        profile = it.messages[1]["content"].split(".")[0].removeprefix("Profile: ")
        name = it.target["tool_calls"][0]["function"]["name"]
        assert name in PROFILES[profile].values() and name in it.hint
