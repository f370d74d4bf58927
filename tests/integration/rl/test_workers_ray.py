"""Rollout units through Ray actors equal the same units run locally, exactly (hf engine, same seeds);
an actor killed mid-run costs a retry of its unit, not the unit, and the retry is counted. Both tests join
the loopback cluster the rollout-worker modules share (``ray_address``: tests/integration/rl/conftest.py;
the trainer's private cluster is test_data_parallel_trainer's CLI test's)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch

from cadenza.executor import ExecutorConfig
from cadenza.rl.engines.policy import HFPolicy
from cadenza.rl.train.ray_workers import RayWorkers
from cadenza.rl.train.workers import LocalWorkers
from tests.support.rl_fixtures import config
from tests.support.rl_fixtures import step_units as _units

pytestmark = [pytest.mark.slow, pytest.mark.serial("ray")]


def _fingerprint(results):
    out = []
    for eps in results:
        assert eps is not None
        for e in eps:
            t = e.rollout.tokens
            out.append(
                (t.group_id, list(t.input_ids), list(t.behaviour_logprobs), t.reward,
                 e.trajectory.meta.get("policy_version"), len(e.hints))
            )  # fmt: skip
    return out


@pytest.fixture
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_ray_actors_reproduce_local_units_and_survive_a_killed_actor(
    sft_model, tmp_path, one_thread, ray_address
):
    cfg = config(sft_model, tmp_path / "run", steps=2)
    weights = dict(HFPolicy.from_pretrained(sft_model).model.named_parameters())
    with torch.no_grad():  # a version the actors could not have loaded from disk
        for w in weights.values():
            w.mul_(1.01)
    units = _units(cfg, steps=(1,))  # one step's units (each sampled four times below)
    local = LocalWorkers(cfg)
    local.sync(weights.items(), version=5)
    want = _fingerprint(local.run(units))
    assert len(want) == len(units) * cfg.rollout.group_size
    assert {f[4] for f in want} == {5}

    ex = ExecutorConfig(kind="ray", workers=2, max_retries=2, ray_address=ray_address)
    workers = RayWorkers(cfg, 2, ex, timeout_s=300)
    try:
        workers.sync(weights.items(), version=5)
        assert _fingerprint(workers.run(units)) == want
        assert workers.counts.retried == workers.counts.lost == 0

        victim = workers.pids()[0]
        box: dict = {}
        runner = threading.Thread(target=lambda: box.update(res=workers.run(units * 2)))
        runner.start()
        deadline = time.monotonic() + 60
        while workers.slots[0].busy is None and time.monotonic() < deadline:  # kill it mid-unit
            time.sleep(0.005)
        assert workers.slots[0].busy is not None, "the first actor never got a unit"
        os.kill(victim, signal.SIGKILL)
        runner.join(timeout=600)
        assert not runner.is_alive()
        assert _fingerprint(box["res"]) == want * 2  # nothing lost, nothing changed
        assert workers.counts.retried >= 1 and workers.counts.lost == 0 and workers.counts.restarts == 1
        assert victim not in workers.pids()
    finally:
        workers.close()


def test_trainer_on_ray_actors_trains_exactly_like_units_in_process(sft_model, tmp_path, ray_address):
    """Two steps of GRPO + SD with rollouts in two Ray actors (weights pushed after every update) give the
    same metrics, bit for bit, as the same units rolled out in the trainer's process."""
    import dataclasses

    from cadenza.metrics import read_metrics
    from cadenza.rl.rollout.episodes import collect_episodes
    from cadenza.rl.train.trainer import Trainer
    from cadenza.rl.train.workers import unit_seed
    from tests.support.rl_fixtures import TIMING

    class UnitTrainer(Trainer):
        def _collect(self, step, tasks):
            return [
                e
                for i, t in enumerate(tasks)
                for e in collect_episodes(
                    self.engine, self.tokenizer, self.source, self.cfg, step, [t],
                    seed=unit_seed(self.cfg, step, i), group_offset=i,
                )
            ]  # fmt: skip

    local_cfg = config(sft_model, tmp_path / "local", steps=2, lambda_sd=1.0)
    UnitTrainer(local_cfg).train()
    ray_cfg = config(sft_model, tmp_path / "ray", steps=2, lambda_sd=1.0)
    ray_cfg.rollout = dataclasses.replace(ray_cfg.rollout, executor="ray", workers=2, ray_address=ray_address)
    Trainer(ray_cfg).train()

    def rows(path):
        return [{k: v for k, v in r.items() if k not in TIMING} for r in read_metrics(path / "metrics.jsonl")]

    got, want = rows(tmp_path / "ray"), rows(tmp_path / "local")
    assert [r["units_retried"] for r in got] == [0, 0] and [r["units_lost"] for r in got] == [0, 0]
    assert [{k: v for k, v in r.items() if not k.startswith("units_")} for r in got] == want
    assert want[0]["sd_loss"] != want[1]["sd_loss"] and want[1]["sd_loss"] > 0  # real, updated steps
