"""One update over microbatches equals the same update over the whole step (both GRPO aggregations)."""

from __future__ import annotations

import copy

import pytest
import torch

from cadenza.rl.config import LossConfig, OptimConfig, TrainConfig
from cadenza.rl.engines.policy import HFPolicy, tiny_qwen3_config
from cadenza.rl.learn.losses import group_advantages, grpo_loss
from cadenza.rl.learn.teacher import Teacher
from cadenza.rl.rollout.episodes import TrainEpisode
from cadenza.rl.rollout.loop import RolloutParams, RolloutTask, rollout
from cadenza.rl.text.tokens import collate
from cadenza.rl.train.update import Learner
from tests.support.rl_helpers import CounterEnv, ScriptedPolicy, make_tokenizer

CALL = '<tool_call>\n{{"name": "{}", "arguments": {}}}\n</tool_call>'
SCRIPTS = [
    [CALL.format("add", '{"x": 1}'), CALL.format("add", '{"x": 2}'), CALL.format("submit", "{}")],
    ["Let me add three now.\n" + CALL.format("add", '{"x": 3}'), CALL.format("submit", "{}")],
    [CALL.format("submit", "{}")],
    [CALL.format("ad", '{"x": 1}'), CALL.format("add", '{"x": 10}'), CALL.format("submit", "{}")],
]


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


@pytest.fixture(scope="module")
def episodes(tok):
    """Four episodes of one group, of very different lengths, with varied rewards."""
    out = []
    for turns, reward in zip(SCRIPTS, [1.0, 0.0, 0.5, 0.0], strict=True):
        [r] = rollout(ScriptedPolicy(tok, turns), tok, [RolloutTask(task_id="t", make_env=CounterEnv)],
                      RolloutParams(group_size=1, max_new_tokens=256))  # fmt: skip
        r.tokens.reward = reward
        out.append(TrainEpisode(rollout=r, tools=[], render_tools=[]))
    lengths = [e.rollout.tokens.num_model_tokens for e in out]
    assert len(set(lengths)) == len(lengths)  # sequence_mean and token_mean really differ here
    return out


def _update(tok, episodes, aggregation: str, microbatch: int):
    policy = HFPolicy.from_config(tiny_qwen3_config(len(tok), initializer_range=0.2), seed=5)
    cfg = TrainConfig(
        loss=LossConfig(lambda_sd=0.0, aggregation=aggregation, drop_zero_variance=False),
        optim=OptimConfig(microbatch=microbatch, grad_clip=0.0),
    )
    start = copy.deepcopy(policy.model.state_dict())
    learner = Learner(cfg=cfg, policy=policy, tokenizer=tok, teacher=Teacher(policy.model),
                      optimizer=torch.optim.SGD(policy.model.parameters(), lr=1.0))  # fmt: skip
    res = learner.update(episodes)
    moved = {n: p.detach() - start[n] for n, p in policy.model.state_dict().items()}
    return res, moved, policy, start


@pytest.mark.parametrize("aggregation", ["sequence_mean", "token_mean"])
def test_microbatched_update_equals_the_whole_batch(tok, episodes, aggregation):
    whole, moved, policy, start = _update(tok, episodes, aggregation, microbatch=len(episodes))
    # the whole-batch value is the library loss on the whole batch (recomputed here from scratch)
    policy.model.load_state_dict(start)
    tokens = [e.rollout.tokens for e in episodes]
    batch = collate(tokens, tok.pad_token_id)
    with torch.no_grad():
        from cadenza.rl.learn.logprobs import sequence_logprobs

        hidden, _ = policy.hidden_states(batch.input_ids, batch.attention_mask)
        lp, _ = sequence_logprobs(hidden, policy.lm_head, batch.input_ids, batch.loss_mask)
    adv = group_advantages([t.reward for t in tokens], [t.group_id for t in tokens])
    ref = grpo_loss(lp, batch.behaviour_logprobs, adv, batch.loss_mask, 0.2, 0.28, aggregation=aggregation)
    assert whole.grpo_loss == pytest.approx(float(ref), rel=1e-5)
    for mb in (1, 3):
        split, moved_mb, _, _ = _update(tok, episodes, aggregation, microbatch=mb)
        assert split.grpo_loss == pytest.approx(whole.grpo_loss, rel=1e-5), f"microbatch {mb}"
        for name, delta in moved.items():
            torch.testing.assert_close(moved_mb[name], delta, rtol=1e-4, atol=1e-7, msg=name)


def test_a_step_whose_groups_all_tie_is_skipped_not_an_error(tok, episodes):
    """Every group's rewards equal: no GRPO term and no SD, so the update is skipped (zero gradient)."""
    tied = copy.deepcopy(episodes)
    for e in tied:
        e.rollout.tokens.reward = 1.0
    for aggregation in ("sequence_mean", "token_mean"):
        res, *_ = _update(tok, tied, aggregation, microbatch=2)
        assert res.skipped and res.zero_variance_groups == 1 and res.grpo_loss == 0.0
