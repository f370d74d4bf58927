"""The engine router: a session's turns stay on one engine, new sessions spread by load, syncs stream to
all."""

from __future__ import annotations

import pytest
import torch

from cadenza.errors import CadenzaError
from cadenza.rl.engines.hf import HFEngine
from cadenza.rl.engines.policy import HFPolicy, tiny_qwen3_config
from cadenza.rl.rollout.loop import RolloutParams, RolloutTask, rollout
from cadenza.rl.rollout.router import Router
from tests.support.rl_helpers import CounterEnv, ScriptedPolicy, make_tokenizer

TURNS = [
    '<tool_call>{"name": "add", "arguments": {"x": 1}}</tool_call>',
    '<tool_call>{"name": "add", "arguments": {"x": 2}}</tool_call>',
    '<tool_call>{"name": "submit", "arguments": {}}</tool_call>',
]


class Stamped:
    """A scripted engine that stamps its samples with its own version (which engine served a turn)."""

    name = "scripted"

    def __init__(self, tokenizer, version: int) -> None:
        self.policy, self.version = ScriptedPolicy(tokenizer, TURNS), version

    def sample(self, request):
        out = self.policy.sample(request)
        for s in out:
            s.policy_version = self.version
        return out

    def close(self) -> None:
        pass


def test_sessions_stick_to_one_engine_and_spread_by_load():
    tok = make_tokenizer()
    router = Router([Stamped(tok, 1), Stamped(tok, 2)])
    tasks = [RolloutTask(task_id=f"t{n}", make_env=lambda n=n: CounterEnv(target=n)) for n in (3, 4, 5, 6)]
    # lockstep: a scripted engine answers by its call count, so every call must be one turn of all
    params = RolloutParams(group_size=2, max_turns=4, max_new_tokens=64, schedule="lockstep")
    results = rollout(router, tok, tasks, params)
    per_episode = [[t.extra["policy_version"] for t in r.trajectory.turns] for r in results]
    assert all(len(v) == 3 for v in per_episode)  # add, add, submit: three turns each
    assert all(len(set(v)) == 1 for v in per_episode), per_episode  # affinity: one engine per episode
    groups = [per_episode[i][0] for i in range(0, len(results), 2)]
    assert all(
        per_episode[i][0] == per_episode[i + 1][0] for i in range(0, len(results), 2)
    )  # a group shares
    assert sorted(groups) == [1, 1, 2, 2]  # four sessions of distinct tasks: two per engine
    assert router.sessions == [2, 2] and sum(router.served) == 3 * len(results)


def test_sync_streams_one_pass_to_every_engine():
    tok = make_tokenizer()
    conf = tiny_qwen3_config(len(tok), head_dim=16)
    engines = [HFEngine(HFPolicy.from_config(conf, seed=s), share=False) for s in (1, 2)]
    router = Router(engines, queue_depth=1)
    new = HFPolicy.from_config(conf, seed=7).model
    passes = []

    def stream():
        passes.append(1)
        for name, p in new.named_parameters():
            yield name, p.detach()

    router.sync_weights(stream(), version=4)
    assert passes == [1] and router.version == 4
    for e in engines:
        for (name, p), (_, q) in zip(e.policy.model.named_parameters(), new.named_parameters(), strict=True):
            assert torch.equal(p, q), name
    with pytest.raises(CadenzaError, match=r"no\.such\.weight"):
        router.sync_weights(iter([("no.such.weight", torch.zeros(1))]), version=5)
    router.close()


def test_least_loaded_engine_ties_go_round_robin():
    """The driver's routing decision over every actor: the least-loaded engine, ties rotating (never all
    to engine 0, which one router per actor did)."""
    from cadenza.rl.train.ray_workers import least_loaded

    load = [0, 0]
    picks = []
    for turn in range(4):
        e = least_loaded(load, turn)
        load[e] += 1
        picks.append(e)
    assert sorted(picks) == [0, 0, 1, 1] and picks[0] != picks[1]
    assert least_loaded([3, 1, 2], 0) == 1 and least_loaded([1, 1, 0], 5) == 2


def test_router_sends_new_sessions_to_the_preferred_engine_and_keeps_old_ones():
    from cadenza.rl.rollout.router import Router

    r = Router([object(), object()])
    first = r.route([1, 2, 3])
    r.prefer = 1 - first
    assert r.route([7, 8, 9]) == 1 - first  # a new session: where the driver said
    assert r.route([1, 2, 3, 4]) == first  # an old one keeps its engine (its prefix cache)
