"""``bench/gpu_sharded_rl.sh`` cannot run here (no GPU); its CPU analogue does: the same driver
(``bench/gpu_sharded_rl.py --device cpu``) runs ``cadenza train`` with the policy sharded in a one-rank
group (``CADENZA_FORCE_SHARDING=1``), a random-init tiny MoE and the real vLLM engine (CPU build) synced
straight from the shards after every step, with the parity probe and the tensor-name check on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.engine_helpers import requires_vllm

ROOT = Path(__file__).resolve().parents[3]


def test_the_gpu_script_is_valid_bash():
    subprocess.run(["bash", "-n", str(ROOT / "bench" / "gpu_sharded_rl.sh")], check=True, timeout=30)


@pytest.mark.slow
@pytest.mark.serial
@requires_vllm
def test_the_cpu_analogue_trains_and_syncs_from_the_shards(tmp_path):
    cmd = [sys.executable, str(ROOT / "bench" / "gpu_sharded_rl.py"), "--device", "cpu", "--steps", "2",
           "--out", str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["steps"] == [1, 2] and result["weight_transfer"] == "worker", result
    assert all(s > 0 for s in result["sync_s"]), result  # both syncs ran (checked by the probe and names)
    meta = json.loads(next((tmp_path / "run" / "checkpoints").glob("step-*/meta.json")).read_text())
    assert meta["format"] == "dcp"  # the policy really was sharded
