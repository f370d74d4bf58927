"""Ray rollout actors against a served engine (the real vLLM CPU build, one server for the module).

The actors hold no weights: the driver syncs the engine in place and tells them the version; each actor
samples through its own router. The same units give the same trajectories (token ids) through Ray actors
as through local workers against the same engine, tagged with the synced version, and every listener of
the run (Ray's and the engine's) is on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch

from cadenza.executor import ExecutorConfig
from cadenza.rl.engines import make_engine
from cadenza.rl.engines.policy import HFPolicy
from cadenza.rl.text.chat import load_tokenizer
from cadenza.rl.train.ray_workers import RayWorkers
from cadenza.rl.train.workers import LocalWorkers
from tests.support.engine_helpers import requires_vllm
from tests.support.ray_cluster import listeners
from tests.support.rl_fixtures import config
from tests.support.rl_fixtures import step_units as _units

pytestmark = [pytest.mark.slow, pytest.mark.serial, requires_vllm]

LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1", "::1"}


def _train_on_ray_and_vllm(model, out, *, steps: int, max_staleness: int) -> list[dict]:
    """``cadenza train`` with ``executor = "ray"``, ``engine = "vllm"`` (two actors); checks that the
    engine took every update, nothing was retried or lost, and no engine or Ray process is left."""
    import psutil

    from cadenza.rl.train.trainer import Trainer
    from tests.support.engine_helpers import engine_processes, free_port

    port = free_port()
    cfg = config(model, out, steps=steps, lambda_sd=1.0)
    cfg.rollout = dataclasses.replace(
        cfg.rollout, engine="vllm", executor="ray", workers=2, engine_timeout_s=300,
        max_staleness=max_staleness, engine_options={"max_model_len": 1024, "kv_cache_gib": 1, "port": port},
    )  # fmt: skip
    rows = Trainer(cfg).train()
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    assert all(r["sync_s"] > 0 and r["episodes"] > 0 for r in rows)  # the engine took every update
    assert all(r["units_retried"] == 0 and r["units_lost"] == 0 for r in rows)  # counts are reported
    assert (out / "engine.log").is_file()
    assert engine_processes(port) == []
    left = []
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if p.status() != psutil.STATUS_ZOMBIE:
                left.append(p.name())
    assert not left, f"processes left behind: {left}"  # no engine, no Ray cluster, no supervisor
    return rows


def test_trainer_on_ray_and_vllm_at_max_staleness_1_keeps_the_bounded_schedule(sft_model_32, tmp_path):
    """``executor = "ray"`` with ``engine = "vllm"`` at K = 1: the trainer starts the engine, syncs it after
    every update, the actors sample from it, and the run ends with no engine or Ray process (checked in
    ``_train_on_ray_and_vllm``; K = 0 is the same wiring, covered by test_train_vllm and test_workers_ray).
    Step s's rollouts run while step s - 1 trains, so step s is sampled by version max(0, s - 2) (the
    update starts from version s - 1: lag 0, 1, 1); nothing is older than K, so nothing is dropped, and
    every episode of a step carries the same version. (Runs before the module's shared engine starts.)"""
    rows = _train_on_ray_and_vllm(sft_model_32, tmp_path / "run", steps=3, max_staleness=1)
    sampled = [max(0, s - 2) for s in (1, 2, 3)]
    assert [r["policy_version"] for r in rows] == [0, 1, 2]  # the weights each update starts from
    assert [r["policy_version"] - r["staleness_max"] for r in rows] == sampled  # the oldest sampler
    assert [r["policy_version"] - r["staleness_mean"] for r in rows] == sampled  # ... and every one
    assert [r["dropped_stale"] for r in rows] == [0, 0, 0] and rows[-1]["dropped_stale_total"] == 0
    assert rows[0]["mismatch_kl"] < 1e-3  # step 1: sampled by the very weights it trains from


@pytest.fixture(scope="module")
def engine(sft_model_32):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    eng = make_engine(
        "vllm", model=str(sft_model_32), max_model_len=1024, request_timeout_s=120, sync_timeout_s=60
    )
    try:
        yield eng
    finally:
        eng.close()
        torch.set_num_threads(threads)


def _tokens(results) -> list[tuple]:
    out = []
    for eps in results:
        assert eps is not None
        for e in eps:
            t = e.rollout.tokens
            out.append((t.group_id, list(t.input_ids), t.reward, e.policy_version))
    return out


def _logprobs(results) -> list[float]:
    return [x for eps in results for e in eps for x in e.rollout.tokens.behaviour_logprobs]


def test_ray_actors_on_a_served_engine_reproduce_local_workers(engine, sft_model_32, tmp_path):
    cfg = config(sft_model_32, tmp_path / "run", steps=2)
    cfg.rollout = dataclasses.replace(cfg.rollout, engine="vllm", engine_timeout_s=300)
    tok = load_tokenizer(str(sft_model_32))
    weights = dict(HFPolicy.from_pretrained(sft_model_32).model.named_parameters())
    with torch.no_grad():  # a version the engine could not have loaded from disk
        for w in weights.values():
            w.mul_(1.01)
    units = _units(cfg)
    local = LocalWorkers(cfg, engines=[engine], tokenizer=tok)
    local.sync(weights.items(), version=5)
    assert engine.version == 5
    first = local.run(units)
    want = _tokens(first)
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
        assert _tokens(got) == want  # same token ids, rewards and policy version, through Ray actors
        assert _logprobs(got) == pytest.approx(_logprobs(first), abs=1e-4)  # batching may move the last bits
        assert workers.counts.retried == workers.counts.lost == 0
        seen = listeners()
        names = {n for _, _, n in seen}
        assert any("raylet" in n for n in names) and any("python" in n for n in names), seen
        assert {ip for ip, _, _ in seen} <= LOOPBACK, seen

        workers.sync(weights.items(), version=6)  # the trainer's next update: engine synced, actors told
        assert engine.version == 6 and workers.version == 6
        assert {v for *_, v in _tokens(workers.run(units[:1]))} == {6}
    finally:
        workers.close()
    assert engine.server.alive()  # not owned by the workers: still serving
