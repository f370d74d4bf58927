"""The capacity model's arithmetic: stages scale with their counts, the slowest one sets the pace."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from cadenza.scale import (
    Demand,
    UnitCosts,
    plan,
    predict_build_seconds,
    predict_episodes_per_min,
    predict_tasks_per_min,
    scale_measured_episodes,
)


def test_engine_bound_run_needs_cores_in_proportion_to_engine_gpus():
    costs = UnitCosts(trainer_s_per_step=1.0)  # a trainer this fast never limits
    one = plan(costs, Demand(engine_gpus=4))
    two = plan(costs, Demand(engine_gpus=8))
    assert one["bottleneck"] == two["bottleneck"] == "engine"
    assert two["episodes_per_min"] == pytest.approx(2 * one["episodes_per_min"], rel=1e-3)
    per_episode = costs.sandbox_core_s_per_episode + costs.grade_core_s_per_episode
    assert two["rollout_worker_cores"] >= two["episodes_per_min"] * per_episode / 60


def test_trainer_bound_run_ignores_extra_engines_and_task_building_adds_cores():
    costs = UnitCosts(trainer_s_per_step=600.0)
    a = plan(costs, Demand(engine_gpus=8))
    b = plan(costs, Demand(engine_gpus=64))
    assert a["bottleneck"] == b["bottleneck"] == "trainer"
    assert a["episodes_per_min"] == b["episodes_per_min"]
    c = plan(costs, Demand(engine_gpus=8, new_tasks_per_hour=3600))
    assert c["task_build_cores"] == math.ceil(costs.build_core_s_per_task)  # 3600 tasks/h: one per second
    assert c["worker_cores"] > a["worker_cores"]


def test_worker_predictions_are_linear_until_the_engine_saturates():
    costs = UnitCosts()
    assert predict_tasks_per_min(costs, 2) == pytest.approx(2 * predict_tasks_per_min(costs, 1))
    slow_engine = 10.0  # seconds of engine time per episode: 6 episodes/min at most
    assert predict_episodes_per_min(costs, 1000, slow_engine) == pytest.approx(6.0)


def test_a_source_s_own_work_does_not_split_over_workers():
    one = [(10.0, 20.0)]  # 10 s fetch/env/baseline, then 20 s of candidates on one worker
    assert predict_build_seconds(one, 1) == pytest.approx(30.0)
    assert predict_build_seconds(one, 2) == pytest.approx(20.0)  # not 15: the 10 s stay serial
    assert predict_build_seconds(one, 1000) > 10.0
    two = [(10.0, 20.0), (2.0, 4.0)]
    assert predict_build_seconds(two, 1) == pytest.approx(36.0)
    assert predict_build_seconds(two, 2) == pytest.approx(30.0)  # the big source alone sets the pace
    assert predict_build_seconds(two, 4) == pytest.approx(20.0)
    with pytest.raises(ValueError, match="worker"):
        predict_build_seconds(one, 0)


def test_bad_input_and_cli():
    with pytest.raises(ValueError, match="engine_gpus"):
        plan(UnitCosts(), Demand(engine_gpus=0))
    res = subprocess.run(
        [sys.executable, "-m", "cadenza.scale", "--engine-gpus", "16"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == plan(UnitCosts(), Demand(engine_gpus=16))
    res = subprocess.run(
        [sys.executable, "-m", "cadenza.scale", "--trainer-gpus", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2 and "trainer_gpus must be positive" in res.stderr


def test_measured_episode_rate_scales_with_workers_until_the_cores_are_busy():
    # an episode of 1.5 core-s on 4 cores: at most 160/min, whatever the workers
    assert scale_measured_episodes(30.0, 2, 1.5, 4) == pytest.approx(60.0)  # room left: linear
    assert scale_measured_episodes(30.0, 8, 1.5, 4) == pytest.approx(160.0)  # the cores cap it
    # one worker whose episodes already keep 1.8 of 2 cores busy gains at most 1/0.9 from a second
    one = 45.0
    core_s = 1.8 * 60 / one
    assert scale_measured_episodes(one, 2, core_s, 2) == pytest.approx(one / 0.9)
    for bad in ((30.0, 0, 1.5, 4), (30.0, 2, 0.0, 4), (30.0, 2, 1.5, 0), (-1.0, 2, 1.5, 4)):
        with pytest.raises(ValueError):
            scale_measured_episodes(*bad)
