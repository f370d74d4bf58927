"""Rollout workers that cannot reach their served engine, on a real loopback Ray cluster.

An endpoint nobody answers is one line before any unit runs (every actor health-checks its endpoints at
start); an engine that goes away after the start fails each unit's engine calls, the unit is re-run up
to ``max_retries`` times (counted), then the run stops with one line naming the unit, and no episode of
a failed unit is returned. Both tests join the loopback cluster the
rollout-worker modules share (``ray_address``: tests/integration/rl/conftest.py).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from cadenza.errors import CadenzaError
from cadenza.executor import ExecutorConfig
from cadenza.rl.train.ray_workers import RayWorkers
from cadenza.rl.train.workers import LocalWorkers
from tests.support.chat_server import closed_port_url
from tests.support.rl_fixtures import config
from tests.support.rl_fixtures import step_units as _units

pytestmark = [pytest.mark.slow, pytest.mark.serial("ray")]


class _Models(BaseHTTPRequestHandler):
    """Answers the workers' health check (``GET /v1/models``) like a served engine; nothing else."""

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        raw = json.dumps({"data": [{"id": "cadenza"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


def _engine(url: str) -> SimpleNamespace:
    """The driver's handle of a served engine: where it listens and which version it holds."""
    return SimpleNamespace(client=SimpleNamespace(base_url=url), version=0, close=lambda: None)


def _cfg(sft_model, tmp_path):
    cfg = config(sft_model, tmp_path / "run", steps=1)
    cfg.rollout = dataclasses.replace(cfg.rollout, engine="vllm", engine_timeout_s=60)
    return cfg


def test_unreachable_engine_is_one_line_before_any_work(sft_model, tmp_path, ray_address):
    cfg = _cfg(sft_model, tmp_path)
    url = closed_port_url().removesuffix("/v1")
    with pytest.raises(CadenzaError) as local:
        LocalWorkers(cfg, engines=[_engine(url)])
    t0 = time.monotonic()
    with pytest.raises(CadenzaError) as ray_err:
        ex = ExecutorConfig(kind="ray", workers=2, ray_address=ray_address)
        RayWorkers(cfg, 2, ex, timeout_s=120, engines=[_engine(url)])
    assert time.monotonic() - t0 < 120
    for err in (local, ray_err):
        msg = str(err.value)
        assert "cannot reach its engine" in msg and url in msg, msg
        assert len(msg.splitlines()) == 1 and "Traceback" not in msg


def test_engine_gone_after_start_retries_the_unit_then_stops_with_one_line(sft_model, tmp_path, ray_address):
    cfg = _cfg(sft_model, tmp_path)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Models)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    workers = RayWorkers(
        cfg,
        2,
        ExecutorConfig(kind="ray", workers=2, max_retries=2, ray_address=ray_address),
        timeout_s=120,
        engines=[_engine(url)],
    )
    try:
        httpd.shutdown()  # the engine goes away after every actor's health check passed
        httpd.server_close()
        with pytest.raises(CadenzaError) as err:
            workers.run(_units(cfg, steps=(1,)))
        msg = str(err.value)
        assert msg.startswith("rollout unit (step 1, task ") and "failed on 3 attempt(s)" in msg, msg
        assert url in msg and len(msg.splitlines()) == 1
        assert workers.counts.retried >= 2 and workers.counts.lost == 0
        assert all(s.busy is None for s in workers.slots)
    finally:
        workers.close()
