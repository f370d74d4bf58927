"""Partial rollouts with real log-probs: a real HF engine (its own weight copy), a real weight sync in the
middle of a rollout, and every turn's behaviour log-probs are the score of its tokens under the weights
of the version it records; the truncated IS weights the loss uses then match a float64 reference token
by token (below 1 or capped on the old version's turns, exactly 1 on the new version's)."""

from __future__ import annotations

import copy
import math
import threading

import pytest
import torch

from cadenza.agent.env import StepResult
from cadenza.agent.loop import NO_TOOL_CALL
from cadenza.rl.engines.gpu_sync import ModuleWeights
from cadenza.rl.engines.hf import HFEngine
from cadenza.rl.engines.policy import HFPolicy, tiny_qwen3_config
from cadenza.rl.learn.losses import truncated_is_weights
from cadenza.rl.rollout.loop import RolloutParams, RolloutTask, rollout
from cadenza.rl.rollout.pipeline import RolloutPipeline, WatchedEngine
from tests.support.rl_helpers import CounterEnv, make_tokenizer

CAP = 2.0


class HeldFirstAnswer(CounterEnv):
    """Answers a turn without a tool call (the nudge) as usual, but the first answer of every episode
    waits for ``synced``: the sync lands while no batch is in flight, so turn 0 is sampled by version
    0 and every later turn by version 1, whatever the timing."""

    synced = threading.Event()
    waiting = threading.Semaphore(0)  # released once per episode held at its first answer

    def __init__(self) -> None:
        super().__init__(target=99)
        self.answers = 0

    def _held(self) -> None:
        self.answers += 1
        if self.answers == 1:
            HeldFirstAnswer.waiting.release()
            assert HeldFirstAnswer.synced.wait(60), "the test never synced"

    def step(self, call):
        self._held()
        return super().step(call)

    def respond(self, content):
        self._held()
        return StepResult(observation=NO_TOOL_CALL, done=False, error_kind="no_tool_call")


def _score(model: torch.nn.Module, ids: list[int], span: tuple[int, int]) -> list[float]:
    """Log-probs (float64, temperature 1) of ``ids[start:end]`` given what precedes them."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    start, end = span
    return [float(logp[t - 1, ids[t]]) for t in range(start, end)]


def test_each_turn_scores_under_its_own_version_and_the_is_weights_match_float64():
    tok = make_tokenizer()
    v0 = HFPolicy.from_config(tiny_qwen3_config(len(tok)), seed=0, dtype="float64")
    v1 = copy.deepcopy(v0.model)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # the "update": every weight moves by a few percent
        for p in v1.parameters():
            p.add_(0.05 * p.abs().mean() * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    engine = WatchedEngine(HFEngine(v0, share=False, version=0))
    pipe = RolloutPipeline(engine, timeout_s=60)
    tasks = [RolloutTask(task_id=f"t{i}", make_env=HeldFirstAnswer) for i in range(2)]
    cfg = RolloutParams(group_size=2, max_turns=3, max_new_tokens=8, no_tool_call="nudge")
    HeldFirstAnswer.synced.clear()
    try:
        pipe.submit(1, lambda: rollout(engine, tok, tasks, cfg, seed=7))
        for _ in range(4):  # every episode holds at its first answer: turn 0's batch is done
            assert HeldFirstAnswer.waiting.acquire(timeout=60)
        pipe.sync(lambda: ModuleWeights(v1), 1, partial=True)
        HeldFirstAnswer.synced.set()
        out = pipe.take(1)
    finally:
        HeldFirstAnswer.synced.set()
        pipe.close()
    models = {0: v0.model, 1: v1}
    weights_checked = {0: 0, 1: 0}
    for r in out:
        t = r.tokens
        versions = [int(turn.extra["policy_version"]) for turn in r.trajectory.turns]
        assert versions == [0, 1, 1], versions  # one trajectory, two versions
        assert r.trajectory.meta["policy_version"] == 0  # the oldest: what the staleness bound reads
        for span, v in zip(t.turn_spans, versions, strict=True):
            mu = t.behaviour_logprobs[span[0] : span[1]]
            # the engine hands log-probs back in float32: equal to its rounding
            assert mu == pytest.approx(_score(models[v], t.input_ids, span), abs=2e-6)
            other = _score(models[1 - v], t.input_ids, span)
            assert max(abs(a - b) for a, b in zip(mu, other, strict=True)) > 1e-3  # the versions differ
            # the update's proximal log-probs are the trainer's current weights (version 1)
            prox = _score(v1, t.input_ids, span)
            w, capped = truncated_is_weights(
                torch.tensor(prox, dtype=torch.float64), torch.tensor(mu, dtype=torch.float64), CAP
            )
            ref = [min(math.exp(p - m), CAP) for p, m in zip(prox, mu, strict=True)]
            assert w.tolist() == pytest.approx(ref, rel=1e-12)
            assert capped.tolist() == [math.exp(p - m) > CAP for p, m in zip(prox, mu, strict=True)]
            if v == 1:
                assert w.tolist() == pytest.approx([1.0] * len(ref), abs=1e-5)
            else:
                assert max(abs(x - 1.0) for x in ref) > 1e-3
            weights_checked[v] += len(ref)
    assert weights_checked[0] > 0 and weights_checked[1] > 0
