"""``cadenza train`` with the real vLLM engine (CPU build): synchronous and asynchronous (K = 1) runs end
to end, the engine synced after every update, the staleness schedule kept, no engine process left."""

from __future__ import annotations

import dataclasses
import socket
import subprocess

import pytest

from cadenza.rl.trainer import Trainer
from tests.integration.engine_helpers import requires_vllm
from tests.rl_fixtures import config

pytestmark = [pytest.mark.slow, requires_vllm]


def _engine_processes(port: int) -> list[str]:
    """vLLM processes serving ``port`` (other tests may run engines of their own meanwhile)."""
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True, timeout=30).stdout
    return [line for line in out.splitlines() if "vllm.entrypoints" in line and f"--port {port}" in line]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("k", [0, 1])
def test_train_with_the_vllm_engine(sft_model_32, tmp_path, k):
    port = _free_port()
    cfg = config(sft_model_32, tmp_path / "run", steps=3, lambda_sd=1.0)
    cfg.rollout = dataclasses.replace(
        cfg.rollout,
        engine="vllm",
        max_staleness=k,
        engine_timeout_s=300,
        engine_options={"max_model_len": 1024, "kv_cache_gib": 1, "port": port},
    )
    rows = Trainer(cfg).train()
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["sync_s"] > 0 for r in rows)  # the engine took new weights after every update
    assert [r["staleness_max"] for r in rows] == [min(s - 1, k) for s in (1, 2, 3)]
    assert all(r["mismatch_kl"] > -1e-6 and r["episodes"] > 0 for r in rows)  # k3 >= 0 up to rounding
    if k == 0:  # same weights on both sides: engine and trainer log-probs agree (fp32 engine)
        assert max(r["mismatch_kl"] for r in rows) < 1e-3
    assert (tmp_path / "run" / "engine.log").is_file()
    assert _engine_processes(port) == []  # the engine did not outlive the run
