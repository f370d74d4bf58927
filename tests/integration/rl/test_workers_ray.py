"""Rollout units through Ray actors equal the same units run locally, exactly (hf engine, same seeds);
an actor killed mid-run costs a retry of its unit, not the unit, and the retry is counted; the trainer on
Ray actors trains exactly like units in process. One module fixture trains both ways, and its trainer's two
actors then serve the first test (one pair of actor starts, not two). The module joins the loopback cluster
the rollout-worker modules share (``ray_address``: tests/integration/rl/conftest.py; the trainer's private
cluster is test_data_parallel_trainer's CLI test's)."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest
import torch

from cadenza.metrics import read_metrics
from cadenza.rl.engines.policy import HFPolicy
from cadenza.rl.rollout.episodes import collect_episodes
from cadenza.rl.train.ray_workers import RayWorkers
from cadenza.rl.train.trainer import Trainer
from cadenza.rl.train.workers import LocalWorkers, unit_seed
from tests.support.ray_cluster import shared_address
from tests.support.rl_fixtures import TIMING, config
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


def _actors() -> list[str]:
    """The classes of this driver's live actors, from the GCS's actor table (the state API needs the
    dashboard, which the cluster does not run)."""
    import ray
    from ray._private import state

    job = ray.get_runtime_context().get_job_id()
    found = state.actors().values()
    return sorted(a["ActorClassName"] for a in found if a["JobID"] == job and a["State"] == "ALIVE")


@pytest.fixture
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


class _UnitTrainer(Trainer):
    """The trainer with the step's units rolled out in its own process, one after the other."""

    def _collect(self, step, tasks):
        return [
            e
            for i, t in enumerate(tasks)
            for e in collect_episodes(
                self.engine, self.tokenizer, self.source, self.cfg, step, [t],
                seed=unit_seed(self.cfg, step, i), group_offset=i,
            )
        ]  # fmt: skip


class _KeepWorkers(Trainer):
    """The trainer on Ray actors, keeping its :class:`RayWorkers` past ``train()`` for the first test."""

    kept: RayWorkers | None = None

    def close(self) -> None:
        if self._engine is not None:
            self.kept, self._engine = self._engine.engine, None
        super().close()


@pytest.fixture(scope="module")
def trained(sft_model, tmp_path_factory):
    """Two steps of GRPO + SD with rollouts in two Ray actors (weights pushed after every update), and the
    same units rolled out in the trainer's process: (metric rows on Ray, rows in process, the Ray run's
    config, its workers, still running)."""
    import dataclasses

    tmp = tmp_path_factory.mktemp("trained")
    local_cfg = config(sft_model, tmp / "local", steps=2, lambda_sd=1.0)
    _UnitTrainer(local_cfg).train()
    ray_cfg = config(sft_model, tmp / "ray", steps=2, lambda_sd=1.0)
    ray_cfg.rollout = dataclasses.replace(
        ray_cfg.rollout, executor="ray", workers=2, ray_address=shared_address()
    )
    trainer = _KeepWorkers(ray_cfg)
    try:
        trainer.train()
        workers = trainer.kept
        assert isinstance(workers, RayWorkers), workers
        assert _actors() == ["RolloutWorker", "RolloutWorker"]  # and no progress-channel actor: unused
    except BaseException:
        if trainer.kept is not None:
            trainer.kept.close()
        raise

    def rows(path):
        return [{k: v for k, v in r.items() if k not in TIMING} for r in read_metrics(path / "metrics.jsonl")]

    try:
        yield rows(tmp / "ray"), rows(tmp / "local"), ray_cfg, workers
    finally:
        workers.close()


def test_ray_actors_reproduce_local_units_and_survive_a_killed_actor(trained, one_thread, ray_address):
    """The trained run's two actors, brought to weights they could not have loaded from disk, roll out the
    units exactly as this process does; an actor killed mid-unit costs a retry."""
    *_, cfg, workers = trained
    weights = dict(HFPolicy.from_pretrained(cfg.model.path).model.named_parameters())
    with torch.no_grad():  # a version the actors could not have loaded from disk
        for w in weights.values():
            w.mul_(1.01)
    units = _units(cfg, steps=(1,))  # one step's units (each sampled four times below)
    local = LocalWorkers(cfg)
    local.sync(weights.items(), version=5)
    want = _fingerprint(local.run(units))
    assert len(want) == len(units) * cfg.rollout.group_size
    assert {f[4] for f in want} == {5}

    assert workers.counts.retried == workers.counts.lost == workers.counts.restarts == 0  # the training's
    workers.sync(weights.items(), version=5)
    assert _fingerprint(workers.run(units)) == want
    assert workers.counts.retried == workers.counts.lost == 0

    # The actors run at this process's niceness on the joined cluster (Ray's default, 15, starved them
    # beside busy processes: 4 actors took over 400 s to import torch on a loaded 2-core machine)
    assert {psutil.Process(p).nice() for p in workers.pids()} == {os.nice(0)}
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


def test_trainer_on_ray_actors_trains_exactly_like_units_in_process(trained, ray_address):
    """Two steps of GRPO + SD with rollouts in two Ray actors (weights pushed after every update) give the
    same metrics, bit for bit, as the same units rolled out in the trainer's process."""
    got, want, *_ = trained
    assert [r["units_retried"] for r in got] == [0, 0] and [r["units_lost"] for r in got] == [0, 0]
    assert [{k: v for k, v in r.items() if not k.startswith("units_")} for r in got] == want
    assert want[0]["sd_loss"] != want[1]["sd_loss"] and want[1]["sd_loss"] > 0  # real, updated steps
