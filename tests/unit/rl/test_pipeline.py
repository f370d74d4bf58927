"""The rollout pipeline and the local hf engine without training: job order, the watchdog, clean
shutdown, and weight syncs that check what they load."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from cadenza.errors import CadenzaError, ContextLengthExceeded, EngineError
from cadenza.rl.engines.hf import HFEngine
from cadenza.rl.engines.policy import HFPolicy, SampleRequest, SamplingParams, tiny_qwen3_config
from cadenza.rl.rollout.pipeline import RolloutPipeline, WatchedEngine


class _Engine:
    """Records the order of calls; ``block`` makes the next sample wait until ``close``."""

    name = "fake"
    version = 0

    def __init__(self) -> None:
        self.log: list[str] = []
        self.block = False
        self.released = threading.Event()

    def sample(self, request):
        self.log.append("sample")
        if self.block:
            self.released.wait(30)
            raise RuntimeError("closed while generating")
        return []

    def sync_weights(self, named_tensors, *, version):
        self.log.append(f"sync{version}")
        self.version = version

    def close(self) -> None:
        self.released.set()


def test_jobs_run_in_submission_order_and_syncs_wait_for_them():
    eng = _Engine()
    pipe = RolloutPipeline(WatchedEngine(eng), timeout_s=5)
    try:
        seen = []
        for s in (1, 2):
            pipe.submit(s, lambda s=s: (time.sleep(0.05), seen.append((s, eng.version)), s)[-1])
        pipe.sync(lambda: iter(()), version=1)
        pipe.submit(3, lambda: (seen.append((3, eng.version)), 3)[-1])
        assert pipe.take(1) == 1 and pipe.take(3) == 3 and pipe.ready() == {2: 2}
        assert seen == [(1, 0), (2, 0), (3, 1)] and eng.log == ["sync1"]
        with pytest.raises(CadenzaError, match="no rollouts were queued for step 9"):
            pipe.take(9)
    finally:
        pipe.close()
    assert not pipe.thread.is_alive()


def test_hung_engine_call_times_out_with_one_line_and_close_releases_it():
    eng = _Engine()
    eng.block = True
    watched = WatchedEngine(eng)
    pipe = RolloutPipeline(watched, timeout_s=0.3)
    pipe.submit(1, lambda: watched.sample(SampleRequest([[1]], SamplingParams())))
    t0 = time.monotonic()
    with pytest.raises(EngineError, match=r"engine 'fake' did not finish a generation within 0.3 s"):
        pipe.take(1)
    assert time.monotonic() - t0 < 5
    pipe.close()  # closes the engine, which ends the hung call; the thread is joined
    assert eng.released.is_set() and not pipe.thread.is_alive()
    with pytest.raises(EngineError, match="training stopped"):
        watched.sample(SampleRequest([[1]], SamplingParams()))


def test_watched_engine_errors_become_one_line_and_overflow_stays_an_overflow():
    class Broken(_Engine):
        def sample(self, request):
            raise ValueError(f"HTTP 400: This model's maximum context length is 8 tokens\n{request.prompts}")

        def sync_weights(self, named_tensors, *, version):
            raise OSError("connection refused\ntraceback...")

    w = WatchedEngine(Broken())
    with pytest.raises(ContextLengthExceeded, match=r"maximum context length is 8 tokens$"):
        w.sample(SampleRequest([[1]], SamplingParams()))
    with pytest.raises(
        EngineError,
        match=r"^engine 'fake' failed during weight sync to version 3: OSError: connection refused$",
    ):
        w.sync_weights(iter(()), version=3)
    assert w.busy is None


def test_local_engine_sync_checks_names_shapes_and_completeness():
    policy = HFPolicy.from_config(
        tiny_qwen3_config(64, hidden_size=32, intermediate_size=64, head_dim=8), seed=0
    )
    engine = HFEngine(policy, share=False)
    named = dict(policy.model.named_parameters())
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(1.0)
    engine.sync_weights(((n, p.detach()) for n, p in named.items()), version=4)
    assert engine.version == 4
    assert all(torch.equal(p, named[n]) for n, p in engine.policy.model.named_parameters())
    assert all(p.data_ptr() != named[n].data_ptr() for n, p in engine.policy.model.named_parameters())
    first = next(iter(named))
    with pytest.raises(CadenzaError, match="has no weight named"):
        engine.sync_weights([("nope.weight", torch.zeros(1))], version=5)
    with pytest.raises(CadenzaError, match="has shape"):
        engine.sync_weights([(first, torch.zeros(3))], version=5)
    with pytest.raises(CadenzaError, match=r"left .* tensor\(s\) out"):
        engine.sync_weights([(first, named[first].detach())], version=5)
    samples = engine.sample(
        SampleRequest([[1, 2, 3]], SamplingParams(max_new_tokens=2), torch.Generator().manual_seed(0))
    )
    assert samples[0].policy_version == 4 and len(samples[0].token_ids) == 2
