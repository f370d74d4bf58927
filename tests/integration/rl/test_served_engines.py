"""Two real vLLM CPU servers (the trainer's own start-up path, ``served_engines``), one pair for the module.

``rollout.engines = 2`` behind the router: episodes spread over both engines and each episode's turns
stay on the engine that took its first turn; one weight sync (one pass over the tensors) reaches both,
each then scores like the trainer's new weights, and every sample after it is tagged with the new
version; the router draws each prompt's seed before it splits a batch, so two engines give the same
token ids as one engine for the same seeds.

Ray rollout actors against a served engine (one of the pair): the actors hold no weights; the driver
syncs the engine in place and tells them the version; each actor samples through its own router. The
same units give the same trajectories (token ids) through Ray actors as through local workers against
the same engine, tagged with the synced version, and every listener of the run (Ray's and the
engine's) is on 127.0.0.1.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cadenza.executor import ExecutorConfig
from cadenza.rl.engines.policy import HFPolicy
from cadenza.rl.text.chat import load_tokenizer
from cadenza.rl.train.local_engine import served_engines
from cadenza.rl.train.ray_workers import RayWorkers
from cadenza.rl.train.workers import LocalWorkers
from tests.support.engine_helpers import TOL, engine_processes, hf_logprobs, requires_vllm
from tests.support.ray_cluster import listeners
from tests.support.rl_fixtures import config
from tests.support.rl_fixtures import step_units as _units

pytestmark = [pytest.mark.slow, pytest.mark.serial, requires_vllm]

LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1", "::1"}


@pytest.fixture(scope="module")
def two(sft_model_32, tmp_path_factory):
    """Two vLLM servers started as the trainer starts them, stopped (and checked gone) at the end."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    cfg = config(sft_model_32, tmp_path_factory.mktemp("two") / "run", steps=2)
    cfg.rollout = dataclasses.replace(
        cfg.rollout, engine="vllm", engines=2, engine_timeout_s=300,
        engine_options={"max_model_len": 1024, "kv_cache_gib": 1},
    )  # fmt: skip
    policy = HFPolicy.from_pretrained(sft_model_32)
    tok = load_tokenizer(str(sft_model_32))
    engines = served_engines(cfg, policy, tok, version=0)
    ports = [e.server.port for e in engines]
    try:
        yield cfg, engines, policy, tok
    finally:
        for e in engines:
            e.close()
        torch.set_num_threads(threads)
        assert all(engine_processes(p) == [] for p in ports)


def _record(router) -> list[tuple[int, tuple[int, ...], int]]:
    """Spy on the router's clients: (engine index, prompt, version of the sample) of every request."""
    seen: list[tuple[int, tuple[int, ...], int]] = []
    for i, client in enumerate(router.engines):
        real = client.sample

        def sample(request, real=real, i=i):
            out = real(request)
            seen.extend((i, tuple(p), s.policy_version) for p, s in zip(request.prompts, out, strict=True))
            return out

        client.sample = sample
    return seen


def _tokens(results) -> list[tuple]:
    return [
        (e.rollout.tokens.group_id, list(e.rollout.tokens.input_ids), e.policy_version)
        for eps in results
        for e in eps
    ]


def test_two_engines_spread_keep_sessions_sync_together_and_match_one_engine(two):
    cfg, engines, policy, tok = two
    assert len(engines) == 2 and engines[0].server.port != engines[1].server.port
    weights = dict(policy.model.named_parameters())
    with torch.no_grad():  # a version neither engine could have loaded from disk
        for w in weights.values():
            w.mul_(1.01)
    probe = [tok.encode("You are a counting agent. Make the counter reach 3, then submit.")[:24]]
    new = [hf_logprobs(policy, s) for s in probe]

    def gap(engine) -> float:
        got = [torch.tensor(x) for x in engine.score(probe)]
        return max(float((g - n).abs().max()) for g, n in zip(got, new, strict=True))

    assert all(gap(e) > 10 * TOL for e in engines)  # neither holds the new weights yet
    both = LocalWorkers(cfg, engines=engines, tokenizer=tok)
    both.sync(weights.items(), version=5)  # one streamed pass feeds both engines
    assert [e.version for e in engines] == [5, 5]
    assert all(gap(e) <= TOL for e in engines)  # both really serve the new weights

    units = _units(cfg, steps=(1,))  # two groups: one per engine
    seen = _record(both.worker.engine)
    got = both.run(units)
    assert {v for *_, v in _tokens(got)} == {5} and {v for *_, v in seen} == {5}
    per_engine = [sum(1 for i, *_ in seen if i == k) for k in (0, 1)]
    assert min(per_engine) > 0, per_engine  # each engine got work
    roots: dict[tuple[int, ...], int] = {}  # first-turn prompt -> its engine
    later = 0
    for i, prompt, _ in seen:
        root = next((r for r in roots if prompt[: len(r)] == r), None)
        if root is None:
            roots[prompt] = i
        else:
            later += len(prompt) > len(root)
            assert roots[root] == i, "a later turn of an episode went to another engine"
    assert later > 0 and {roots[r] for r in roots} == {0, 1}  # multi-turn episodes, on both engines
    both.close()  # not the owner: the engines keep serving

    one = LocalWorkers(cfg, engines=engines[:1], tokenizer=tok)
    assert one.worker.engine.version == 5
    ref = one.run(units)
    assert _tokens(got) == _tokens(ref)  # same seeds: the same token ids from two engines as from one
    assert len({tuple(ids) for _, ids, _ in _tokens(ref)}) > 1  # real samples, not one repeated sequence


def _results(results) -> list[tuple]:
    out = []
    for eps in results:
        assert eps is not None
        for e in eps:
            t = e.rollout.tokens
            out.append((t.group_id, list(t.input_ids), t.reward, e.policy_version))
    return out


def _logprobs(results) -> list[float]:
    return [x for eps in results for e in eps for x in e.rollout.tokens.behaviour_logprobs]


def test_ray_actors_on_a_served_engine_reproduce_local_workers(two, sft_model_32, tmp_path):
    engine = two[1][0]  # one of the pair (the test above may have synced it: any version goes)
    cfg = config(sft_model_32, tmp_path / "run", steps=2)
    cfg.rollout = dataclasses.replace(cfg.rollout, engine="vllm", engine_timeout_s=300)
    tok = load_tokenizer(str(sft_model_32))
    weights = dict(HFPolicy.from_pretrained(sft_model_32).model.named_parameters())
    with torch.no_grad():  # a version the engine could not have loaded from disk
        for w in weights.values():
            w.mul_(0.99)  # (not the pair test's 1.01: either test may run first)
    units = _units(cfg)
    local = LocalWorkers(cfg, engines=[engine], tokenizer=tok)
    local.sync(weights.items(), version=5)
    assert engine.version == 5
    first = local.run(units)
    want = _results(first)
    assert len(want) == len(units) * cfg.rollout.group_size
    assert {v for *_, v in want} == {5}
    assert len({tuple(ids) for _, ids, _, _ in want}) > 1  # real samples, not one repeated sequence

    workers = RayWorkers(
        cfg, 2, ExecutorConfig(kind="ray", workers=2), timeout_s=300, engines=[engine], own_engines=False,
        tokenizer=tok,
    )  # fmt: skip
    try:
        assert workers.version == 5
        got = workers.run(units)
        assert _results(got) == want  # same token ids, rewards and policy version, through Ray actors
        assert _logprobs(got) == pytest.approx(_logprobs(first), abs=1e-4)  # batching may move the last bits
        assert workers.counts.retried == workers.counts.lost == 0
        seen = listeners()
        names = {n for _, _, n in seen}
        assert any("raylet" in n for n in names) and any("python" in n for n in names), seen
        assert {ip for ip, _, _ in seen} <= LOOPBACK, seen

        workers.sync(weights.items(), version=6)  # the trainer's next update: engine synced, actors told
        assert engine.version == 6 and workers.version == 6
        assert {v for *_, v in _results(workers.run(units[:1]))} == {6}
    finally:
        workers.close()
    assert engine.server.alive()  # not owned by the workers: still serving
