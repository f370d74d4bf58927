"""Partial rollouts: a weight sync lands between two generation batches of the rollout in progress, never
under one; the episodes go on with the new weights, and every turn records the version that sampled it
(the oldest is the trajectory's, which the staleness bound reads)."""

from __future__ import annotations

import threading
import time

import pytest

from cadenza.errors import EngineError
from cadenza.rl.engines.policy import Sample
from cadenza.rl.rollout.loop import RolloutParams, RolloutTask, rollout
from cadenza.rl.rollout.pipeline import RolloutPipeline, WatchedEngine
from tests.support.rl_helpers import CounterEnv, make_tokenizer


class VersionedEcho:
    """An engine answering every prompt with one tool call after ``seconds``; it records each batch's
    version and fails if weights change while a batch is in flight."""

    name = "hf"

    def __init__(self, tok, seconds: float) -> None:
        self.ids = [*tok.encode('<tool_call>\n{"name": "add", "arguments": {"x": 1}}\n</tool_call>'),
                    tok.eos_token_id]  # fmt: skip
        self.seconds, self.version, self.in_flight, self.batches = seconds, 0, 0, []

    def sample(self, request):
        self.in_flight += 1
        v = self.version
        time.sleep(self.seconds)
        assert self.version == v, "weights changed under a batch"
        self.in_flight -= 1
        self.batches.append(v)
        return [Sample(token_ids=list(self.ids), logprobs=[-1.0] * len(self.ids), finish_reason="stop",
                       policy_version=v) for _ in request.prompts]  # fmt: skip

    def sync_weights(self, named, *, version):
        assert self.in_flight == 0, "a sync ran under a batch"
        list(named)
        self.version = version


def _turn_versions(r) -> list[int]:
    return [int(t.extra["policy_version"]) for t in r.trajectory.turns]


def _queued(seconds: float, tasks: int, max_turns: int):
    """A pipeline whose engine takes ``seconds`` per batch, with step 1's rollout queued."""
    tok = make_tokenizer()
    engine = VersionedEcho(tok, seconds)
    watched = WatchedEngine(engine)
    pipe = RolloutPipeline(watched, timeout_s=30)
    envs = [RolloutTask(task_id=f"t{i}", make_env=lambda: CounterEnv(target=99)) for i in range(tasks)]
    cfg = RolloutParams(group_size=2, max_turns=max_turns, max_new_tokens=40)
    pipe.submit(1, lambda: rollout(watched, tok, envs, cfg, seed=1))
    return engine, pipe


def test_a_sync_lands_between_batches_and_later_turns_use_the_new_weights():
    engine, pipe = _queued(0.15, tasks=2, max_turns=6)
    try:
        time.sleep(0.4)  # the rollout is in its second or third batch
        t0 = time.monotonic()
        pipe.sync(lambda: iter([]), 1, partial=True)
        assert time.monotonic() - t0 < 0.5  # waited for one batch at most, not for the whole rollout
        out = pipe.take(1)
    finally:
        pipe.close()
    assert 0 in engine.batches and 1 in engine.batches
    for r in out:
        versions = _turn_versions(r)
        assert versions == sorted(versions) and versions[0] == 0 and versions[-1] == 1, versions
        assert r.trajectory.meta["policy_version"] == 0  # the oldest turn's: what staleness reads


def test_without_partial_the_sync_waits_for_the_queued_rollout():
    _, pipe = _queued(0.05, tasks=1, max_turns=5)
    try:
        pipe.sync(lambda: iter([]), 1)
        out = pipe.take(1)
    finally:
        pipe.close()
    assert all(set(_turn_versions(r)) == {0} for r in out)


def test_a_batch_that_never_ends_fails_the_partial_sync_with_one_line():
    tok = make_tokenizer()
    engine = VersionedEcho(tok, 5.0)
    watched = WatchedEngine(engine)
    t = threading.Thread(target=lambda: watched.sample(_request(tok)), daemon=True)
    t.start()
    time.sleep(0.2)
    with pytest.raises(EngineError, match=r"did not finish within 0\.5 s of the weight sync to version 3"):
        watched.sync_between_batches(iter([]), version=3, timeout_s=0.5)


def _request(tok):
    from cadenza.rl.engines.policy import SampleRequest, SamplingParams

    return SampleRequest([[1, 2, 3]], SamplingParams(max_new_tokens=4), None, [7])


def test_the_watchdog_sees_the_oldest_of_several_batches_in_flight():
    """Served engines take several batches at once: a batch that finished must not hide an older one
    still hung (the watchdog reads the oldest call in flight)."""
    tok = make_tokenizer()
    engine = VersionedEcho(tok, 0.0)
    watched = WatchedEngine(engine)
    slow = threading.Event()
    engine.sample = lambda request: slow.wait(5) or []  # a batch that hangs until released
    t = threading.Thread(target=lambda: watched.sample(_request(tok)), daemon=True)
    t.start()
    time.sleep(0.3)
    with watched._watch("generation"):  # a second, quick call starts and ends meanwhile
        pass
    assert watched.overdue(0.2) == "generation"
    slow.set()
    t.join(5)
    assert watched.busy is None and watched.overdue(0.0) is None
