"""A sharded policy (2 gloo ranks, ``[parallel] ep = 2``, tiny Qwen3-MoE) syncs into a running vLLM engine
(CPU build) straight from the shards: no rank keeps an unsharded copy, every rank gathers one tensor at a
time and rank 0 feeds the engine's buckets. After an optimizer step the engine's greedy decoding is
token-exact against the trainer's gathered HF model and its log-probs agree to 1e-4; the trainer's own
checks (``check_received`` on every bucketed reload, the parity probe) pass. A step whose sync is skipped
(the ranks gather, rank 0 feeds nothing) fails the same comparison: the test can fail.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.support.engine_helpers import TOL, requires_vllm
from tests.support.ranks import run_ranks

pytestmark = [pytest.mark.slow, pytest.mark.serial, requires_vllm]


def _launch(model: Path, out: Path, tmp: Path, world: int = 2) -> list[str]:
    cmd = [sys.executable, "-m", "tests.support.sharded_sync_script", str(model), str(out)]
    return [o for _, o in run_ranks(cmd, world, tmp)]


def test_sharded_policy_syncs_into_vllm_with_greedy_parity(sft_moe, tmp_path):
    outs = _launch(sft_moe, tmp_path / "run", tmp_path)
    line = next(x for x in outs[0].splitlines() if x.startswith("RESULT "))
    res = json.loads(line[len("RESULT ") :])
    assert res["streams"] and not res["rollout_copy"], "a vllm engine is synced from the shards, no copy"
    synced, skipped = res["step1"], res["step2"]
    assert not synced["skipped_update"] and not skipped["skipped_update"]
    assert synced["version"] == 1 and all(synced["exact"]), synced
    assert synced["gap"] <= TOL, synced
    # without the sync the engine holds step 1's weights while the trainer moved on: the check fails
    assert skipped["gap"] > 10 * TOL, skipped
