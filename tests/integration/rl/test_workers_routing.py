"""Ray rollout actors over two served engines on a real loopback Ray cluster: one routing decision over
every actor's load, and a per-unit deadline.

The engines are two loopback HTTP servers speaking the completions protocol (each answers every
request with the end-of-turn token, so an episode is one request); they count what they serve. A third
never answers a completion: its unit must stop at ``rollout.unit_timeout_s``, not at the engine timeout.
Both tests join the loopback cluster the rollout-worker modules share (``ray_address``, from
tests/integration/rl/conftest.py: a cluster start is seconds to tens of seconds under load; the private
cluster's own start and teardown are tests/integration/executor/test_ray*.py's).
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
from cadenza.rl.text.chat import load_tokenizer
from cadenza.rl.train.ray_workers import RayWorkers
from tests.support.rl_fixtures import config
from tests.support.rl_fixtures import step_units as _units

pytestmark = [pytest.mark.slow, pytest.mark.serial("ray")]

# the case was 8; 4 checks the same (one router per actor sent all 4 to engine 0, the driver's
# decision splits them 2/2) with half the actors to start
ACTORS = 4


def _server(eos: int, *, hang: bool = False) -> tuple[ThreadingHTTPServer, list[int]]:
    served: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, body: dict) -> None:
            raw = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self) -> None:  # the workers' health check
            self._send({"data": [{"id": "cadenza"}]})

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if hang:
                time.sleep(120)
                return
            served.append(1)
            choice = {"token_ids": [eos], "logprobs": {"token_logprobs": [-0.5]}, "finish_reason": "stop"}
            self._send({"choices": [choice]})

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    return httpd, served


def _engine(httpd: ThreadingHTTPServer) -> SimpleNamespace:
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    return SimpleNamespace(client=SimpleNamespace(base_url=url), version=0, close=lambda: None)


def _cfg(sft_model, tmp_path, **rollout):
    cfg = config(sft_model, tmp_path / "run", steps=1)
    cfg.rollout = dataclasses.replace(cfg.rollout, engine="vllm", engine_timeout_s=120, **rollout)
    return cfg


@pytest.mark.parametrize("actors", [ACTORS])
def test_units_of_one_step_spread_over_both_engines(sft_model, tmp_path, ray_address, actors):
    """N actors, N units, two engines: each engine gets N / 2 units' sessions in the same step (one
    router per actor sent them all to engine 0), and a group's episodes stay on one engine."""
    eos = load_tokenizer(str(sft_model)).eos_token_id
    (a, served_a), (b, served_b) = _server(eos), _server(eos)
    cfg = _cfg(sft_model, tmp_path, tasks_per_step=actors)
    workers = RayWorkers(
        cfg,
        actors,
        ExecutorConfig(kind="ray", workers=actors, ray_address=ray_address),
        timeout_s=300,  # actors importing torch on 2 shared cores can take minutes to start
        engines=[_engine(a), _engine(b)],
    )
    try:
        out = workers.run(_units(cfg, steps=(1,)))
        assert all(o is not None and len(o) == cfg.rollout.group_size for o in out)
        g, half = cfg.rollout.group_size, actors // 2
        assert (len(served_a), len(served_b)) == (half * g, half * g), (len(served_a), len(served_b))
    finally:
        workers.close()
        for s in (a, b):
            s.shutdown()
            s.server_close()


def test_a_hung_unit_stops_at_its_own_deadline(sft_model, tmp_path, ray_address):
    eos = load_tokenizer(str(sft_model)).eos_token_id
    hung, _ = _server(eos, hang=True)
    cfg = _cfg(sft_model, tmp_path, tasks_per_step=1, unit_timeout_s=2.0)
    workers = RayWorkers(
        cfg,
        1,
        ExecutorConfig(kind="ray", workers=1, max_retries=1, ray_address=ray_address),
        timeout_s=600,
        engines=[_engine(hung)],
    )  # a call timeout far above what two 2 s attempts and an actor restart take, even at load 40
    try:
        t0 = time.monotonic()
        with pytest.raises(CadenzaError) as err:
            workers.run(_units(cfg, steps=(1,)))
        took = time.monotonic() - t0
        msg = str(err.value)
        assert "did not finish within 2 s" in msg and "on 2 attempt(s)" in msg and len(msg.splitlines()) == 1
        assert 4 <= took < 300, took  # 2 x 2 s plus an actor restart (119 s at load 13): not the 600 s call
        # both attempts' actors were killed; only the first was replaced (the stopping run waits for no
        # actor start it would not use): the next use replaces the second
        assert workers.counts.retried == 1 and workers.counts.restarts == 1 and workers.slots[0].dead
        assert all(s.busy is None for s in workers.slots)
    finally:
        workers.close()
        hung.shutdown()
        hung.server_close()
