"""Token trajectories (JSON round trip, validation), chunked log-probs, policy backend, the combined step."""

from __future__ import annotations

import pytest
import torch

from cadenza.errors import CadenzaError
from cadenza.feedback.hints import Hint
from cadenza.rl.config import LossConfig, TeacherConfig
from cadenza.rl.engines.policy import (
    HFPolicy,
    SampleRequest,
    SamplingParams,
    tiny_qwen3_config,
    tiny_qwen3_moe_config,
)
from cadenza.rl.learn.logprobs import sequence_logprobs
from cadenza.rl.learn.losses import group_advantages
from cadenza.rl.learn.step import rl_losses
from cadenza.rl.learn.teacher import Teacher, build_hinted_turns
from cadenza.rl.rollout.loop import RolloutParams, RolloutTask, rollout
from cadenza.rl.text.tokens import TokenTrajectory, TokenTrajectoryBuilder, collate
from tests.support.rl_helpers import CounterEnv, ScriptedPolicy, make_tokenizer


def _builder_trajectory() -> TokenTrajectory:
    b = TokenTrajectoryBuilder()
    b.add("system", [5, 6, 7], 0)
    b.add("prompt", [8, 9], 1)
    b.add("prompt", [10], 2)
    b.add("assistant", [11, 12, 13], 2, [-0.1, -2.5e-9, -13.0 / 7.0])
    b.add("observation", [14, 15], 3)
    b.add("prompt", [10], 4)
    b.add("assistant", [16, 1], 4, [-1e-300, -0.3333333333333333])
    return b.build(
        messages=[{"role": "user", "content": "ü \u2028"}],
        reward=0.5,
        group_id="0:t",
        metadata={"nested": {"a": [1, 2.5]}},
    )


def test_multi_turn_token_trajectory_round_trips_exactly(tmp_path):
    t = _builder_trajectory()
    t.validate()
    assert t.turn_spans == [(6, 9), (12, 14)]
    assert t.loss_mask == [0] * 6 + [1] * 3 + [0] * 3 + [1] * 2
    assert t.turn_tokens(1) == [16, 1]
    t.save(tmp_path / "t.json")
    again = TokenTrajectory.load(tmp_path / "t.json")
    assert again == t
    assert again.input_ids == t.input_ids and again.loss_mask == t.loss_mask
    assert again.behaviour_logprobs == t.behaviour_logprobs  # bit-exact floats
    assert isinstance(again.turn_spans[0], tuple)


@pytest.mark.parametrize(
    ("mutate", "msg"),
    [
        (lambda t: t.loss_mask.pop(), "equal length"),
        (lambda t: t.turn_spans.append((1, 3)), "loss_mask differs"),
        (lambda t: setattr(t.segments[1], "kind", "tool"), "unknown kind"),
        (lambda t: t.behaviour_logprobs.__setitem__(6, float("nan")), "finite"),
        (lambda t: (t.turn_spans.clear(), t.loss_mask.__init__([0] * 14)), "no model tokens"),
        (lambda t: t.input_ids.__setitem__(2, "7"), "non-negative integers"),
    ],
)
def test_invalid_token_trajectories_are_rejected(mutate, msg):
    t = _builder_trajectory()
    mutate(t)
    with pytest.raises(CadenzaError, match=msg):
        t.validate()


def test_from_dict_rejects_foreign_records():
    with pytest.raises(CadenzaError, match="not a token trajectory"):
        TokenTrajectory.from_dict({"input_ids": [1], "bogus": 1})


@pytest.mark.parametrize("chunk", [None, 1, 4])
def test_sequence_logprobs_chunked_matches_plain_log_softmax(chunk):
    pol = HFPolicy.from_config(tiny_qwen3_config(97), seed=1)
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.zeros(2, 9)
    mask[0, 3:7] = 1
    mask[1, 1:9] = 1
    hidden, _ = pol.hidden_states(ids)
    lp, ent = sequence_logprobs(hidden, pol.lm_head, ids, mask, chunk_size=chunk, temperature=0.8)
    logits = pol.lm_head(hidden).double() / 0.8
    ref = torch.log_softmax(logits, -1)[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]
    ref_ent = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1))[:, :-1].sum(-1)
    m = mask[:, 1:].bool()
    torch.testing.assert_close(lp[:, 1:][m].double(), ref[m], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent[:, 1:][m].double(), ref_ent[m], atol=1e-5, rtol=1e-5)
    assert torch.all(lp[~mask.bool()] == 0)
    lp.sum().backward()
    assert pol.lm_head.weight.grad is not None


def test_policy_paths_and_save_load(tmp_path):
    with pytest.raises(CadenzaError, match="does not exist"):
        HFPolicy.from_pretrained(tmp_path / "missing")
    with pytest.raises(CadenzaError, match="dtype"):
        HFPolicy.from_config(tiny_qwen3_config(50), dtype="int8")
    pol = HFPolicy.from_config(tiny_qwen3_moe_config(50), seed=0)
    experts = [n for n, p in pol.model.named_parameters() if "experts" in n and p.ndim == 3]
    assert experts and all(p.shape[0] == 8 for n, p in pol.model.named_parameters() if n in experts)
    pol.model.save_pretrained(tmp_path / "m")
    again = HFPolicy.from_pretrained(tmp_path / "m")
    params = SamplingParams(max_new_tokens=6, temperature=0.9, top_k=10)
    a = pol.sample(SampleRequest([[1, 2, 3], [4]], params, torch.Generator().manual_seed(0)))
    b = again.sample(SampleRequest([[1, 2, 3], [4]], params, torch.Generator().manual_seed(0)))
    assert [s.token_ids for s in a] == [s.token_ids for s in b]
    with pytest.raises(CadenzaError):
        SamplingParams(max_new_tokens=0)


def test_sampled_logprobs_are_those_of_the_sampling_distribution():
    pol = HFPolicy.from_config(tiny_qwen3_config(60, initializer_range=0.2), seed=2)
    prompt = [3, 4, 5]
    [s] = pol.sample(
        SampleRequest(
            [prompt],
            SamplingParams(max_new_tokens=5, temperature=0.7, top_k=4),
            torch.Generator().manual_seed(1),
        )
    )
    with torch.no_grad():
        ids = torch.tensor([prompt + s.token_ids])
        logits = pol.lm_head(pol.hidden_states(ids)[0])[0, len(prompt) - 1 : -1].double() / 0.7
    for i, tok in enumerate(s.token_ids):
        row = logits[i]
        kth = row.topk(4).values[-1]
        assert row[tok] >= kth  # sampled inside the top-k
        ref = row[tok] - torch.logsumexp(row[row >= kth], 0)
        assert s.logprobs[i] == pytest.approx(ref.item(), abs=1e-5)


def _misnamed_then_submit(group_size: int):
    """A scripted episode (a misnamed tool call, then submit) per group member, and a fresh tiny policy."""
    tok = make_tokenizer()
    turns = [
        '<tool_call>\n{"name": "ad", "arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call>',
    ]
    out = rollout(
        ScriptedPolicy(tok, turns),
        tok,
        [RolloutTask(task_id="a", make_env=CounterEnv)],
        RolloutParams(group_size=group_size, max_new_tokens=256),
    )
    pol = HFPolicy.from_config(tiny_qwen3_config(len(tok), initializer_range=0.2), seed=0)
    return tok, pol, [r.tokens for r in out]


def test_rl_losses_combines_grpo_and_sd():
    tok, pol, trajs = _misnamed_then_submit(2)
    trajs[0].reward = 1.0
    batch = collate(trajs, tok.pad_token_id)
    adv = group_advantages(batch.rewards, batch.group_ids)
    items = build_hinted_turns(
        trajs, [[Hint(turn=0, text="Tools: add, submit.", kind="tool_not_found")], []], tok
    )
    teacher = Teacher(pol.model)
    res = rl_losses(pol, batch, adv, items=items, teacher=teacher, loss=LossConfig(lambda_sd=0.5))
    assert res.sd.num_tokens == items[0].num_tokens and res.sd.loss.item() > 0
    assert res.loss.item() == pytest.approx(res.grpo.item() + 0.5 * res.sd.loss.item(), rel=1e-6)
    assert res.entropy_unhinted > 0 and res.num_model_tokens == int(batch.loss_mask.sum())
    res.loss.backward()
    plain = rl_losses(pol, batch, adv, loss=LossConfig(lambda_sd=0.5))
    assert plain.sd.num_tokens == 0 and plain.loss.item() == pytest.approx(res.grpo.item(), rel=1e-6)
    with pytest.raises(CadenzaError, match="no teacher"):
        rl_losses(pol, batch, adv, items=items)


def test_sd_loss_decreases_under_training_and_token_clip_caps_it():
    tok, pol, trajs = _misnamed_then_submit(1)
    batch = collate(trajs, tok.pad_token_id)
    items = build_hinted_turns(
        trajs, [[Hint(turn=0, text="Tools: add, submit.", kind="tool_not_found")]], tok
    )
    clipped = Teacher(pol.model, loss=LossConfig(token_clip=1e-4))
    hidden, cache = pol.hidden_states(batch.input_ids, batch.attention_mask, use_cache=True)
    assert clipped.loss(hidden, pol.lm_head, items, cache).loss.item() == pytest.approx(1e-4)

    teacher = Teacher(pol.model, TeacherConfig(weights="frozen"))
    opt = torch.optim.AdamW(pol.model.parameters(), lr=3e-3)
    zero_adv = torch.zeros(len(trajs))
    history = []
    for _ in range(8):
        opt.zero_grad()
        res = rl_losses(pol, batch, zero_adv, items=items, teacher=teacher, loss=LossConfig(lambda_sd=1.0))
        res.loss.backward()
        opt.step()
        history.append(res.sd.loss.item())
    assert history[-1] < 0.5 * history[0]
