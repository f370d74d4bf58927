"""``cadenza train`` with Ray rollout actors against a served engine (the real vLLM CPU build).

(Ray actors against an engine the driver started and syncs: ``test_served_engines.py``, which shares
its engines between its tests.)
"""

from __future__ import annotations

import contextlib
import dataclasses

import pytest

from tests.support.engine_helpers import requires_vllm
from tests.support.rl_fixtures import config

pytestmark = [pytest.mark.slow, pytest.mark.serial, requires_vllm]


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
    every episode of a step carries the same version."""
    rows = _train_on_ray_and_vllm(sft_model_32, tmp_path / "run", steps=3, max_staleness=1)
    sampled = [max(0, s - 2) for s in (1, 2, 3)]
    assert [r["policy_version"] for r in rows] == [0, 1, 2]  # the weights each update starts from
    assert [r["policy_version"] - r["staleness_max"] for r in rows] == sampled  # the oldest sampler
    assert [r["policy_version"] - r["staleness_mean"] for r in rows] == sampled  # ... and every one
    assert [r["dropped_stale"] for r in rows] == [0, 0, 0] and rows[-1]["dropped_stale_total"] == 0
    assert rows[0]["mismatch_kl"] < 1e-3  # step 1: sampled by the very weights it trains from
