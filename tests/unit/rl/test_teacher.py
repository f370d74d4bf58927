"""Hinted teachers: input construction, KV-cache reuse, gradients, chunking, teacher weights, bad input."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from cadenza.errors import CadenzaError
from cadenza.feedback.hints import Hint
from cadenza.rl.config import LossConfig, TeacherConfig
from cadenza.rl.engines.policy import HFPolicy, tiny_qwen3_config, tiny_qwen3_moe_config
from cadenza.rl.learn.losses import DivergenceSpec, self_distillation_loss
from cadenza.rl.learn.teacher import Teacher, build_hinted_turns, select_rows
from cadenza.rl.rollout.loop import RolloutParams, RolloutTask, rollout
from cadenza.rl.text.chat import render
from cadenza.rl.text.tokens import TokenTrajectory, collate
from tests.support.rl_helpers import CounterEnv, ScriptedPolicy, make_tokenizer

CALL = '<tool_call>\n{{"name": "{}", "arguments": {}}}\n</tool_call>'


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


@pytest.fixture(scope="module")
def trajectories(tok):
    """Two multi-turn trajectories of different lengths (so the batch is padded)."""
    a = [
        CALL.format("ad", '{"x": 1}'),
        CALL.format("add", '{"x": 1}'),
        CALL.format("add", '{"x": 2}'),
        CALL.format("submit", "{}"),
    ]
    b = ["Let me add.\n" + CALL.format("add", '{"x": 3}'), CALL.format("submit", "{}")]
    out = []
    for turns in (a, b):
        [r] = rollout(
            ScriptedPolicy(tok, turns),
            tok,
            [RolloutTask(task_id="t", make_env=CounterEnv)],
            RolloutParams(group_size=1, max_new_tokens=256),
        )
        out.append(r.tokens)
    return out


HINTS = [
    [
        Hint(turn=1, text="Reminder: the available tools are add, submit.", kind="tool_not_found"),
        Hint(turn=3, text="Check the counter first.", kind="nudge"),
    ],
    [Hint(turn=0, text="Use add with an integer x.", kind="schema")],
]


@pytest.mark.parametrize("placement", ["user_before_turn", "append_to_observation"])
def test_teacher_input_is_hinted_rendering_plus_same_turn_tokens(tok, trajectories, placement):
    items = build_hinted_turns(trajectories, HINTS, tok, placement)
    assert [(it.row, it.turn) for it in items] == [(0, 1), (0, 3), (1, 0)]
    for it in items:
        traj = trajectories[it.row]
        start, end = traj.turn_spans[it.turn]
        assert (
            it.teacher_ids[it.teacher_turn_start :] == traj.input_ids[start:end]
        )  # the student's own tokens
        assert it.teacher_ids[: it.shared_prefix] == traj.input_ids[: it.shared_prefix]
        m = next(s.message_index for s in traj.segments if s.start == start)
        msgs = [dict(x) for x in traj.messages[:m]]
        if placement == "user_before_turn":
            msgs.append({"role": "user", "content": it.hint.text})
        else:
            msgs[-1]["content"] += "\n\n" + it.hint.text
        expected = render(tok, msgs, traj.metadata["tools"], add_generation_prompt=True)
        assert tok.decode(it.teacher_ids[: it.teacher_turn_start], skip_special_tokens=False) == expected


def _policy(tok, moe=False, dtype="float32"):
    # a larger init scale than the default so the hint visibly changes the teacher's distribution
    cfg = (tiny_qwen3_moe_config if moe else tiny_qwen3_config)(len(tok), initializer_range=0.2)
    return HFPolicy.from_config(cfg, seed=3, dtype=dtype)


@pytest.mark.parametrize("moe", [False, True])
@pytest.mark.parametrize("placement", ["user_before_turn", "append_to_observation"])
def test_kv_cache_teacher_equals_no_cache_and_unbatched_reference(tok, trajectories, moe, placement):
    pol = _policy(tok, moe)
    batch = collate(trajectories, tok.pad_token_id)
    items = build_hinted_turns(trajectories, HINTS, tok, placement)
    teacher = Teacher(pol.model, TeacherConfig(weights="live"))
    with torch.no_grad():
        _, cache = pol.hidden_states(batch.input_ids, batch.attention_mask, use_cache=True)
        cached = teacher.target_hidden(items, cache)
        plain = teacher.target_hidden(items, None)
        for it, c, p in zip(items, cached, plain, strict=True):
            assert c.shape == p.shape == (it.num_tokens, 64)
            torch.testing.assert_close(c, p, atol=2e-5, rtol=1e-4)
            ref, _ = pol.hidden_states(torch.tensor([it.teacher_ids]))  # one unpadded sequence
            a = it.teacher_turn_start - 1
            torch.testing.assert_close(p, ref[0, a : a + it.num_tokens], atol=2e-5, rtol=1e-4)
    assert all(it.shared_prefix > 0 for it in items)


@pytest.mark.slow  # over 10 s on 2 cores: in make test, not make test-fast
def test_sd_loss_matches_public_loss_and_gradients_stay_in_target_turns(tok, trajectories):
    pol = _policy(tok, dtype="float64")
    batch = collate(trajectories, tok.pad_token_id)
    items = build_hinted_turns(trajectories, HINTS, tok)
    teacher = Teacher(pol.model, TeacherConfig(chunk_size=5), LossConfig(divergence="jsd", beta=0.3))
    hidden, cache = pol.hidden_states(batch.input_ids, batch.attention_mask, use_cache=True)
    hidden.retain_grad()
    result = teacher.loss(hidden, pol.lm_head, items, cache)
    assert result.num_tokens == sum(it.num_tokens for it in items)

    # reference through the public signature: logits [H, T, V] aligned to the same target tokens
    with torch.no_grad():
        H, T = len(items), max(it.num_tokens for it in items)
        s_logits = torch.zeros((H, T, pol.vocab_size), dtype=torch.float64)
        t_logits = torch.zeros_like(s_logits)
        mask = torch.zeros((H, T))
        for i, it in enumerate(items):
            full = pol.lm_head(pol.hidden_states(batch.input_ids[it.row : it.row + 1])[0])[0]
            s_logits[i, : it.num_tokens] = full[it.turn_start - 1 : it.turn_end - 1]
            tl = pol.lm_head(pol.hidden_states(torch.tensor([it.teacher_ids]))[0])[0]
            t_logits[i, : it.num_tokens] = tl[
                it.teacher_turn_start - 1 : it.teacher_turn_start - 1 + it.num_tokens
            ]
            mask[i, : it.num_tokens] = 1
        ref = self_distillation_loss(s_logits, t_logits, mask, DivergenceSpec(divergence="jsd", beta=0.3))
    assert result.loss.item() == pytest.approx(ref.item(), rel=1e-9)

    result.loss.backward()
    g = hidden.grad
    inside = torch.zeros(g.shape[:2], dtype=torch.bool)
    for it in items:
        inside[it.row, it.turn_start - 1 : it.turn_end - 1] = True
    assert torch.all(g[~inside] == 0)
    assert torch.all(g[inside].abs().sum(-1) > 0)

    # float64 finite differences on student hidden states inside the target turns
    h0 = hidden.detach()
    gen = torch.Generator().manual_seed(0)
    coords = inside.nonzero()
    for k in torch.randint(0, len(coords), (4,), generator=gen).tolist():
        b, t = coords[k].tolist()
        d = int(torch.randint(0, h0.shape[-1], (1,), generator=gen))
        eps = 1e-6
        vals = []
        for sign in (1, -1):
            h = h0.clone()
            h[b, t, d] += sign * eps
            with torch.no_grad():
                vals.append(teacher.loss(h, pol.lm_head, items, cache).loss.item())
        fd = (vals[0] - vals[1]) / (2 * eps)
        assert g[b, t, d].item() == pytest.approx(fd, rel=1e-5, abs=1e-9)


@pytest.mark.slow  # over 10 s on 2 cores: in make test, not make test-fast
def test_teacher_gets_no_gradient_and_weight_modes(tok, trajectories):
    pol = _policy(tok)
    batch = collate(trajectories, tok.pad_token_id)
    items = build_hinted_turns(trajectories, HINTS, tok)
    initial = copy.deepcopy(pol.model.state_dict())

    frozen = Teacher(pol.model, TeacherConfig(weights="frozen"))
    hidden, cache = pol.hidden_states(batch.input_ids, batch.attention_mask, use_cache=True)
    frozen.loss(hidden, pol.lm_head, items, cache).loss.backward()
    assert all(p.grad is None for p in frozen.model.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in pol.model.parameters())

    # live teacher: its pass contributes nothing to the gradient (same as a detached precomputed teacher)
    pol.model.zero_grad(set_to_none=True)
    live = Teacher(pol.model, TeacherConfig(weights="live"))
    hidden, cache = pol.hidden_states(batch.input_ids, batch.attention_mask, use_cache=True)
    live.loss(hidden, pol.lm_head, items, cache).loss.backward()
    got = {n: p.grad.clone() for n, p in pol.model.named_parameters() if p.grad is not None}
    pol.model.zero_grad(set_to_none=True)
    with torch.no_grad():
        fixed = [t.clone() for t in live.target_hidden(items, None)]
    hidden, _ = pol.hidden_states(batch.input_ids, batch.attention_mask)
    student = torch.cat([hidden[it.row, it.turn_start - 1 : it.turn_end - 1] for it in items])
    s_logits, t_logits = pol.lm_head(student)[None], pol.lm_head(torch.cat(fixed))[None].detach()
    self_distillation_loss(s_logits, t_logits, torch.ones(s_logits.shape[:2])).backward()
    for n, p in pol.model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(got[n], p.grad, atol=1e-6, rtol=1e-4)

    ema = Teacher(pol.model, TeacherConfig(weights="ema", ema_decay=0.9))
    with torch.no_grad():
        for p in pol.model.parameters():
            p.add_(1.0)
    ema.update(pol.model)
    frozen.update(pol.model)
    for (n, t), s in zip(ema.model.named_parameters(), pol.model.parameters(), strict=True):
        torch.testing.assert_close(t, 0.9 * initial[n] + 0.1 * s.detach())
    for n, t in frozen.model.named_parameters():
        torch.testing.assert_close(t, initial[n])


def test_snapshot_teacher_refreshes_every_n_steps_and_default_is_not_live(tok):
    assert TeacherConfig().weights == "frozen"
    pol = _policy(tok)
    snap = Teacher(pol.model, TeacherConfig(weights="snapshot", refresh_every=3))
    assert snap.model is not pol.model and all(not p.requires_grad for p in snap.model.parameters())
    first = copy.deepcopy(pol.model.state_dict())
    seen = []
    for step in range(1, 8):
        with torch.no_grad():
            for p in pol.model.parameters():
                p.add_(0.01)
        snap.update(pol.model, step=step)
        now = pol.model.state_dict()
        same_as_student = all(torch.equal(t, now[n]) for n, t in snap.model.named_parameters())
        same_as_start = all(torch.equal(t, first[n]) for n, t in snap.model.named_parameters())
        seen.append("student" if same_as_student else "start" if same_as_start else "stale")
    # refreshed at steps 3 and 6, held constant (stale) in between
    assert seen == ["start", "start", "student", "stale", "stale", "student", "stale"]
    with pytest.raises(CadenzaError, match="refresh_every"):
        Teacher(pol.model, TeacherConfig(weights="snapshot", refresh_every=0))


def test_chunked_equals_unchunked(tok, trajectories):
    pol = _policy(tok)
    batch = collate(trajectories, tok.pad_token_id)
    items = build_hinted_turns(trajectories, HINTS, tok)
    grads, losses = [], []
    for chunk in (None, 3):
        pol.model.zero_grad(set_to_none=True)
        teacher = Teacher(pol.model, TeacherConfig(chunk_size=chunk), LossConfig(top_k=5))
        hidden, cache = pol.hidden_states(batch.input_ids, batch.attention_mask, use_cache=True)
        res = teacher.loss(hidden, pol.lm_head, items, cache)
        res.loss.backward()
        assert res.loss.item() > 1e-3
        losses.append(res.loss.item())
        grads.append([p.grad.clone() for p in pol.model.parameters()])
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_bad_input_fails_before_compute(tok, trajectories):
    with pytest.raises(CadenzaError, match="points at turn 9"):
        build_hinted_turns(trajectories, [[Hint(turn=9, text="x", kind="k")], []], tok)
    with pytest.raises(CadenzaError, match="points at turn -1"):
        build_hinted_turns(trajectories, [[Hint(turn=-1, text="x", kind="k")], []], tok)
    empty = TokenTrajectory(
        input_ids=[1, 2], loss_mask=[0, 0], behaviour_logprobs=[0.0, 0.0], segments=[], turn_spans=[]
    )
    with pytest.raises(CadenzaError, match="no model tokens"):
        build_hinted_turns([empty], [[Hint(turn=0, text="x", kind="k")]], tok)
    with pytest.raises(CadenzaError, match="no model tokens"):
        collate([empty], tok.pad_token_id)
    bare = make_tokenizer()
    bare.chat_template = None
    with pytest.raises(CadenzaError, match="chat template"):
        build_hinted_turns(trajectories, HINTS, bare)
    with pytest.raises(CadenzaError, match="placement"):
        build_hinted_turns(trajectories, HINTS, tok, "system")
    with pytest.raises(CadenzaError, match="teacher weights"):
        Teacher(_policy(tok).model, TeacherConfig(weights="other"))
    with pytest.raises(CadenzaError, match="2 trajectories"):
        build_hinted_turns(trajectories, HINTS[:1], tok)


def test_sampled_estimator_uses_target_token_logprobs(tok, trajectories):
    pol = _policy(tok, dtype="float64")
    batch = collate(trajectories, tok.pad_token_id)
    items = build_hinted_turns(trajectories, HINTS, tok)
    teacher = Teacher(pol.model, TeacherConfig(chunk_size=4), LossConfig(sd_estimator="sampled"))
    hidden, cache = pol.hidden_states(batch.input_ids, batch.attention_mask, use_cache=True)
    hidden.retain_grad()
    res = teacher.loss(hidden, pol.lm_head, items, cache)
    gaps, count = 0.0, 0
    with torch.no_grad():
        for it in items:
            s = torch.log_softmax(
                pol.lm_head(pol.hidden_states(batch.input_ids[it.row : it.row + 1])[0])[0], -1
            )
            t = torch.log_softmax(pol.lm_head(pol.hidden_states(torch.tensor([it.teacher_ids]))[0])[0], -1)
            for j in range(it.num_tokens):
                tokid = it.teacher_ids[it.teacher_turn_start + j]
                gaps += (s[it.turn_start - 1 + j, tokid] - t[it.teacher_turn_start - 1 + j, tokid]).item()
                count += 1
    assert res.loss.item() == pytest.approx(gaps / count, rel=1e-9)
    res.loss.backward()
    inside = torch.zeros(hidden.shape[:2], dtype=torch.bool)
    for it in items:
        inside[it.row, it.turn_start - 1 : it.turn_end - 1] = True
    assert torch.all(hidden.grad[~inside] == 0) and hidden.grad[inside].abs().sum() > 0
    with pytest.raises(CadenzaError, match="estimator"):
        Teacher(pol.model, loss=LossConfig(sd_estimator="mc"))


def test_select_rows_reindexes_for_micro_batches(tok, trajectories):
    items = build_hinted_turns(trajectories, HINTS, tok)
    sub = select_rows(items, [1])
    assert [(it.row, it.turn) for it in sub] == [(0, 0)]
    assert sub[0].teacher_ids == items[2].teacher_ids
    assert [(it.row, it.turn) for it in select_rows(items, [1, 0])] == [(1, 1), (1, 3), (0, 0)]


def test_off_policy_step_weights_the_sampled_estimator_and_reports_true_clipping(tok, trajectories):
    """Through the step loss: tokens sampled by another distribution (log-prob -1 each, as the scripted
    engine says) weight each SD token by ``p_s / mu`` (float64 reference by hand); the decoupled ratio
    is 1, so the PPO clip acts on no token whatever the engine/trainer gap (that gap is mismatch_kl)."""
    from cadenza.rl.learn.step import rl_losses

    pol = _policy(tok, dtype="float64")
    batch = collate(trajectories, tok.pad_token_id)
    batch.behaviour_logprobs = batch.behaviour_logprobs.double()
    items = build_hinted_turns(trajectories, HINTS, tok)
    loss = LossConfig(sd_estimator="sampled", is_cap=1e6, lambda_sd=1.0)  # decoupled, cap never bites
    teacher = Teacher(pol.model, TeacherConfig(chunk_size=4), loss)
    res = rl_losses(pol, batch, torch.tensor([1.0, -1.0]), items=items, teacher=teacher, loss=loss,
                    off_policy=True)  # fmt: skip
    total, count = 0.0, 0
    with torch.no_grad():
        for it in items:
            s = torch.log_softmax(
                pol.lm_head(pol.hidden_states(batch.input_ids[it.row : it.row + 1])[0])[0], -1
            )
            t = torch.log_softmax(pol.lm_head(pol.hidden_states(torch.tensor([it.teacher_ids]))[0])[0], -1)
            for j in range(it.num_tokens):
                tokid = it.teacher_ids[it.teacher_turn_start + j]
                ls = s[it.turn_start - 1 + j, tokid].item()
                lt = t[it.teacher_turn_start - 1 + j, tokid].item()
                mu = batch.behaviour_logprobs[it.row, it.turn_start + j].item()
                assert mu == -1.0
                total += math.exp(ls - mu) * (ls - lt)
                count += 1
    assert res.sd.loss.item() == pytest.approx(total / count, rel=1e-9)
    assert res.clip_fraction == 0.0 and res.mismatch_kl > 0.1
