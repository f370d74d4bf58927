"""Rollouts on a tiny env: exact token bookkeeping, with a scripted policy and a tiny random model."""

from __future__ import annotations

import pytest
import torch

from cadenza.errors import CadenzaError
from cadenza.rl.engines.policy import HFPolicy, tiny_qwen3_config, tiny_qwen3_moe_config
from cadenza.rl.rollout.loop import RolloutParams, RolloutTask, rollout
from cadenza.rl.text.chat import render
from cadenza.rl.text.tokens import TokenTrajectory, collate
from tests.support.rl_helpers import CounterEnv, ScriptedPolicy, make_tokenizer


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


def _check_consistent(tok, r):
    t = r.tokens
    t.validate()
    assert len(t.turn_spans) == len(r.trajectory.turns)
    for turn, (start, end) in zip(r.trajectory.turns, t.turn_spans, strict=True):
        assert t.input_ids[start:end] == turn.token_ids  # exact sampled ids, not re-tokenised
        assert t.behaviour_logprobs[start:end] == turn.logprobs
        assert r.trajectory.messages[turn.message_index]["role"] == "assistant"
    assert all(lp == 0.0 for lp, m in zip(t.behaviour_logprobs, t.loss_mask, strict=True) if not m)
    # exact JSON round trip of ids, masks, spans, segments and log-probs
    again = TokenTrajectory.from_json(t.to_json())
    assert again == t


def test_scripted_multi_turn_rollout_matches_template(tok):
    # model outputs written the way the template renders them, so the whole sequence must equal the rendering
    turns = [
        'Adding.\n<tool_call>\n{"name": "add", "arguments": {"x": 1}}\n</tool_call>',
        '<tool_call>\n{"name": "ad", "arguments": {"x": 1}}\n</tool_call>',
        '<tool_call>\n{"name": "add", "arguments": {"x": "two"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "add", "arguments": {"x": 2}}\n</tool_call>',
        '<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call>',
    ]
    pol = ScriptedPolicy(tok, turns)
    [r] = rollout(
        pol,
        tok,
        [RolloutTask(task_id="count3", make_env=CounterEnv)],
        RolloutParams(group_size=1, max_turns=8, max_new_tokens=256),
    )
    _check_consistent(tok, r)
    assert r.reward == 1.0 and r.outcome["resolved"] is True
    assert [t.error_kind for t in r.trajectory.turns] == [None, "tool_not_found", "invalid_arguments", None]
    assert [t.tool for t in r.trajectory.turns] == ["add", "ad", "add", "submit"]
    assert r.tokens.metadata["stop_reason"] == "env_done"
    # the whole sequence equals the template rendering of the conversation (tools in the system message)
    assert tok.decode(r.tokens.input_ids, skip_special_tokens=False) == render(
        tok, r.tokens.messages, CounterEnv().tools()
    )
    kinds = [s.kind for s in r.tokens.segments]
    assert kinds[:3] == ["system", "prompt", "prompt"] and kinds.count("assistant") == 4
    assert kinds.count("observation") == 4


def test_random_model_rollout_spans_and_masks(tok):
    pol = HFPolicy.from_config(tiny_qwen3_moe_config(len(tok)), seed=0)
    cfg = RolloutParams(group_size=2, max_turns=3, max_new_tokens=10, temperature=1.0)
    tasks = [
        RolloutTask(task_id="a", make_env=CounterEnv),
        RolloutTask(task_id="b", make_env=lambda: CounterEnv(2)),
    ]
    done = []
    out = rollout(pol, tok, tasks, cfg, seed=1, on_episode_done=lambda k, n: done.append((k, n)))
    assert len(out) == 4 and done[-1] == (4, 4)
    assert [r.tokens.group_id for r in out] == ["0:a"] * 2 + ["1:b"] * 2
    for r in out:
        _check_consistent(tok, r)
        # behaviour log-probs equal a fresh forward pass of the same model over the stored ids
        ids = torch.tensor([r.tokens.input_ids])
        with torch.no_grad():
            h, _ = pol.hidden_states(ids)
            lp = torch.log_softmax(pol.lm_head(h).float(), -1)[0, :-1].gather(-1, ids[0, 1:, None])[:, 0]
        for start, end in r.tokens.turn_spans:
            torch.testing.assert_close(
                lp[start - 1 : end - 1],
                torch.tensor(r.tokens.behaviour_logprobs[start:end]),
                atol=1e-4,
                rtol=1e-4,
            )
    batch = collate([r.tokens for r in out], tok.pad_token_id)
    assert batch.input_ids.shape[0] == 4 and batch.loss_mask.sum().item() == sum(
        r.tokens.num_model_tokens for r in out
    )


def test_rollout_is_deterministic_under_seed(tok):
    pol = HFPolicy.from_config(tiny_qwen3_config(len(tok)), seed=0)
    cfg = RolloutParams(group_size=2, max_turns=2, max_new_tokens=6)
    tasks = [RolloutTask(task_id="a", make_env=CounterEnv)]
    a = [r.tokens.input_ids for r in rollout(pol, tok, tasks, cfg, seed=7)]
    b = [r.tokens.input_ids for r in rollout(pol, tok, tasks, cfg, seed=7)]
    c = [r.tokens.input_ids for r in rollout(pol, tok, tasks, cfg, seed=8)]
    assert a == b and a != c


def test_rollout_bad_input(tok):
    pol = ScriptedPolicy(tok, ["hi"])
    bare = make_tokenizer()
    bare.chat_template = None
    with pytest.raises(CadenzaError, match="chat template"):
        rollout(pol, bare, [RolloutTask(task_id="a", make_env=CounterEnv)], RolloutParams(group_size=1))
    with pytest.raises(CadenzaError, match="group_size"):
        RolloutParams(group_size=0)
    with pytest.raises(CadenzaError, match="no tasks"):
        rollout(pol, tok, [], RolloutParams())


def test_context_limit_truncates_turn_and_closes_it(tok):
    long_call = '<tool_call>\n{"name": "add", "arguments": {"x": 1}}\n</tool_call>'
    pol = ScriptedPolicy(tok, [long_call])
    [probe] = rollout(
        ScriptedPolicy(tok, [long_call]),
        tok,
        [RolloutTask(task_id="a", make_env=CounterEnv)],
        RolloutParams(group_size=1, max_turns=1, max_new_tokens=256),
    )
    prompt_len = probe.tokens.turn_spans[0][0]
    cfg = RolloutParams(group_size=1, max_turns=5, max_context_tokens=prompt_len + 5, max_new_tokens=256)
    [r] = rollout(pol, tok, [RolloutTask(task_id="a", make_env=CounterEnv)], cfg)
    r.tokens.validate()
    start, end = r.tokens.turn_spans[0]
    assert end - start == 5 and r.trajectory.turns[0].extra["truncated"] is True
    assert r.tokens.input_ids[end] == tok.eos_token_id and r.tokens.loss_mask[end] == 0  # closed, not trained
    assert r.tokens.metadata["stop_reason"] in ("context", "no_tool_call")


class _WindowedEngine(ScriptedPolicy):
    """A scripted engine whose weights move on every call (version = call count) and whose context
    window is ``window`` tokens: longer prompts are refused the way a served engine refuses them."""

    def __init__(self, tokenizer, turns, window: int) -> None:
        super().__init__(tokenizer, turns)
        self.window = window

    def sample(self, request):
        from cadenza.errors import ContextLengthExceeded

        if any(len(p) > self.window for p in request.prompts):
            raise ContextLengthExceeded(f"maximum context length is {self.window} tokens")
        version = self.calls
        out = super().sample(request)
        for s in out:
            s.policy_version = version
        return out


def test_turns_record_their_policy_version_and_context_overflow_ends_as_context(tok):
    call = '<tool_call>\n{"name": "add", "arguments": {"x": 1}}\n</tool_call>'
    [probe] = rollout(
        ScriptedPolicy(tok, [call]),
        tok,
        [RolloutTask(task_id="a", make_env=CounterEnv)],
        RolloutParams(group_size=1, max_turns=2, max_new_tokens=256),
    )
    second_prompt = probe.tokens.turn_spans[1][0]  # the context length at which turn 2 is asked for
    engine = _WindowedEngine(tok, [call], window=second_prompt + 3)  # turn 2 fits, turn 3 does not
    one = RolloutParams(group_size=1, max_new_tokens=256)
    [r] = rollout(engine, tok, [RolloutTask(task_id="a", make_env=CounterEnv)], one)
    _check_consistent(tok, r)
    assert [t.extra["policy_version"] for t in r.trajectory.turns] == [0, 1]
    assert r.trajectory.meta["policy_version"] == 0 and r.tokens.metadata["policy_version"] == 0
    assert r.tokens.metadata["stop_reason"] == "context" and r.trajectory.meta["stop_reason"] == "context"
    assert r.outcome == {"reward": 0.0, "resolved": False}  # finish() graded it like any other episode
