"""Training rollouts through the one agent loop: every episode on its own clock, the same trajectories
whatever the interleaving, tool calls concurrent, turns of different episodes batched together, and
both rules for a turn without a tool call."""

from __future__ import annotations

import threading
import time

import pytest

from cadenza.agent.env import StepResult
from cadenza.agent.loop import NO_TOOL_CALL
from cadenza.rl.engines.policy import HFPolicy, Sample, tiny_qwen3_config
from cadenza.rl.rollout.loop import RolloutParams, RolloutTask, rollout
from tests.support.rl_helpers import CounterEnv, make_tokenizer


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


@pytest.fixture(scope="module")
def policy(tok):
    return HFPolicy.from_config(tiny_qwen3_config(len(tok)), seed=0, dtype="float64")


class Recording:
    """The policy, with every batch it was asked for: how many prompts, at which turn each one is."""

    def __init__(self, policy, eos: int) -> None:
        self.policy, self.eos, self.batches = policy, eos, []
        self.name = "hf"
        # batched by timing, as a served engine is (the float64 tiny model's samples do not move with
        # the batch it runs in): what the test compares is the interleaving, not the engine
        self.fixed_batches = False

    def sample(self, request):
        self.batches.append([sum(t == self.eos for t in p) for p in request.prompts])
        return self.policy.sample(request)


class SlowCounter(CounterEnv):
    """A counter whose answers take ``delay`` seconds (episodes drift apart); it answers a turn without a
    tool call itself (``respond``), as slowly. Counts how many of its kind answer at once."""

    active = 0
    peak = 0
    lock = threading.Lock()

    def __init__(self, delay: float) -> None:
        super().__init__(target=99)
        self.delay = delay

    def _slow(self, answer):
        with SlowCounter.lock:
            SlowCounter.active += 1
            SlowCounter.peak = max(SlowCounter.peak, SlowCounter.active)
        try:
            time.sleep(self.delay)
            return answer()
        finally:
            with SlowCounter.lock:
                SlowCounter.active -= 1

    def step(self, call):
        return self._slow(lambda: super(SlowCounter, self).step(call))

    def respond(self, content):
        return self._slow(lambda: StepResult(observation=NO_TOOL_CALL, done=False, error_kind="no_tool_call"))


class EchoEngine:
    """A stand-in engine that answers every prompt with the same tool call after ``seconds`` per batch
    (the time a generation takes), so the schedule alone decides how turns are batched."""

    name = "hf"

    def __init__(self, tok, seconds: float) -> None:
        self.ids = [
            *tok.encode('<tool_call>\n{"name": "add", "arguments": {"x": 1}}\n</tool_call>'),
            tok.eos_token_id,
        ]
        self.seconds, self.batches, self.eos = seconds, [], tok.eos_token_id

    def sample(self, request):
        self.batches.append([sum(t == self.eos for t in p) for p in request.prompts])
        time.sleep(self.seconds)
        return [Sample(token_ids=list(self.ids), logprobs=[-1.0] * len(self.ids), finish_reason="stop")
                for _ in request.prompts]  # fmt: skip


def _run(tok, engine, delays, **kw):
    SlowCounter.peak = 0
    tasks = [RolloutTask(task_id=f"t{i}", make_env=lambda d=d: SlowCounter(d)) for i, d in enumerate(delays)]
    cfg = RolloutParams(group_size=1, max_turns=kw.pop("max_turns", 3), max_new_tokens=6,
                        no_tool_call="nudge", **kw)  # fmt: skip
    rec = Recording(engine, tok.eos_token_id)
    out = rollout(rec, tok, tasks, cfg, seed=5)
    return out, rec.batches, SlowCounter.peak


def test_same_trajectories_whatever_the_interleaving(tok, policy):
    """The lockstep schedule (the old loop), and the per-episode loop with 1 and 4 concurrent tool
    calls, one episode much faster than the others: different batches, the same tokens and log-probs
    (per-turn seeds) for every episode."""
    delays = [0.0, 0.3, 0.3, 0.3]
    ref, ref_batches, ref_peak = _run(tok, policy, delays, schedule="lockstep")
    assert ref_peak == 1 and all(b == [b[0]] * 4 for b in ref_batches)  # every batch: one turn of all
    for workers in (1, 4):
        out, batches, _ = _run(tok, policy, delays, schedule="per_episode", tool_workers=workers)
        assert batches != ref_batches  # really another interleaving
        assert [r.tokens.input_ids for r in out] == [r.tokens.input_ids for r in ref]
        for x, y in zip(out, ref, strict=True):
            assert x.tokens.behaviour_logprobs == pytest.approx(y.tokens.behaviour_logprobs, abs=1e-9)
            assert x.trajectory.meta["stop_reason"] == y.trajectory.meta["stop_reason"]
    assert sum(len(r.trajectory.turns) for r in ref) == 12  # multi-turn episodes (nudged)


def test_turns_of_different_depths_share_a_batch_and_tools_overlap(tok):
    """Episodes whose tools take 0..0.25 s against a 0.1 s generation: the fast ones go ahead, so
    batches mix turns of different depths, and tool calls of different episodes overlap; under
    lockstep neither happens."""
    delays = [0.0, 0.05, 0.1, 0.15, 0.2, 0.25]
    _, batches, peak = _run(tok, EchoEngine(tok, 0.1), delays, schedule="per_episode", max_turns=5)
    assert any(len(set(b)) > 1 for b in batches) and peak >= 2
    _, batches, peak = _run(tok, EchoEngine(tok, 0.1), delays, schedule="lockstep", max_turns=5)
    assert all(len(set(b)) == 1 for b in batches) and peak == 1


def test_an_engine_whose_samples_move_with_the_batch_gets_the_same_batches_whatever_the_timing(tok, policy):
    """The in-process hf engine (``fixed_batches``): under the per-episode loop every batch still holds
    every live episode in episode order, so the batches (and the samples, bit for bit) are lockstep's;
    the tool calls of different episodes still overlap."""
    delays = [0.0, 0.2, 0.05, 0.2]
    ref, ref_batches, ref_peak = _run(tok, policy, delays, schedule="lockstep")
    fixed = Recording(policy, tok.eos_token_id)
    fixed.fixed_batches = True
    SlowCounter.peak = 0
    tasks = [RolloutTask(task_id=f"t{i}", make_env=lambda d=d: SlowCounter(d)) for i, d in enumerate(delays)]
    cfg = RolloutParams(group_size=1, max_turns=3, max_new_tokens=6, no_tool_call="nudge", tool_workers=4)
    out = rollout(fixed, tok, tasks, cfg, seed=5)
    assert fixed.batches == ref_batches and SlowCounter.peak >= 2 and ref_peak == 1
    assert [r.tokens.input_ids for r in out] == [r.tokens.input_ids for r in ref]
    assert [r.tokens.behaviour_logprobs for r in out] == [r.tokens.behaviour_logprobs for r in ref]


def test_no_tool_call_rule_end_or_nudge(tok, policy):
    """A random model rarely calls a tool: with ``end`` each episode stops after its first such turn;
    with ``nudge`` the env's reminder is appended and the episode continues to ``max_turns``."""
    tasks = [RolloutTask(task_id="a", make_env=CounterEnv)]
    ended = rollout(policy, tok, tasks, RolloutParams(group_size=3, max_turns=3, max_new_tokens=6), seed=2)
    nudged = rollout(policy, tok, tasks, RolloutParams(group_size=3, max_turns=3, max_new_tokens=6,
                                                     no_tool_call="nudge"), seed=2)  # fmt: skip
    for e, n in zip(ended, nudged, strict=True):
        assert not e.trajectory.turns[0].tool and not n.trajectory.turns[0].tool
        assert e.trajectory.meta["stop_reason"] == "no_tool_call" and len(e.trajectory.turns) == 1
        assert n.trajectory.meta["stop_reason"] == "max_turns" and len(n.trajectory.turns) == 3
        assert n.tokens.messages[3] == {"role": "user", "content": NO_TOOL_CALL}
        assert n.trajectory.turns[0].error_kind == "no_tool_call"
        # the first turn is the same sample under both rules (same seed per turn)
        assert n.tokens.turn_tokens(0) == e.tokens.turn_tokens(0)
        n.tokens.validate()
    with pytest.raises(Exception, match="no_tool_call"):
        RolloutParams(no_tool_call="skip")


class LongTask(CounterEnv):
    """A counter task whose statement alone is longer than the engine's window."""

    def reset(self):
        messages = super().reset()
        messages[1]["content"] += " Background: " + "lorem ipsum " * 400
        return messages


class WindowedEngine(EchoEngine):
    """A served-like engine with a context window: it refuses the whole request when any prompt plus its
    own ``max_tokens`` does not fit, as vLLM answers HTTP 400; it records each prompt's limit."""

    def __init__(self, tok, window: int) -> None:
        super().__init__(tok, 0.0)
        self.window, self.limits = window, []
        self.name = "vllm"

    def sample(self, request):
        from cadenza.errors import ContextLengthExceeded

        limits = list(request.max_new_tokens)
        self.limits.append([(len(p), n) for p, n in zip(request.prompts, limits, strict=True)])
        if any(len(p) + n > self.window for p, n in zip(request.prompts, limits, strict=True)):
            raise ContextLengthExceeded(f"maximum context length is {self.window} tokens")
        out = super().sample(request)
        for s, n in zip(out, limits, strict=True):
            s.token_ids, s.logprobs = s.token_ids[:n], s.logprobs[:n]
            s.finish_reason = "stop" if s.token_ids[-1] == self.eos else "length"
        return out


def test_a_long_prompt_ends_only_its_own_episode(tok):
    """One task's prompt is over the window: that episode ends as ``context`` (graded), the others run
    all their turns; every prompt went with its own remaining context as its token limit."""
    from cadenza.rl.text.chat import render

    env = LongTask()
    long_len = len(
        tok.encode(
            render(tok, env.reset(), env.tools(), add_generation_prompt=True), add_special_tokens=False
        )
    )
    engine = WindowedEngine(tok, window=900)
    assert long_len > engine.window
    tasks = [RolloutTask(task_id="long", make_env=LongTask)] + [
        RolloutTask(task_id=f"t{i}", make_env=CounterEnv) for i in range(2)
    ]
    cfg = RolloutParams(group_size=1, max_turns=3, max_new_tokens=40, max_context_tokens=long_len + 10)
    long, *short = rollout(engine, tok, tasks, cfg, seed=1)
    assert long.trajectory.meta["stop_reason"] == "context" and not long.trajectory.turns
    assert long.outcome == {"reward": 0.0, "resolved": False}  # finish() graded it like any other
    for r in short:
        assert r.trajectory.meta["stop_reason"] == "max_turns" and len(r.trajectory.turns) == 3
    sent = [pair for batch in engine.limits for pair in batch]
    assert all(
        n == min(40, long_len + 10 - length) for length, n in sent
    )  # each prompt: its own remaining context
    assert (long_len, 10) in sent and any(
        n == 40 for _, n in sent
    )  # the long prompt asked for 10, the others 40
    assert any(
        len(batch) == 1 and batch[0][0] == long_len for batch in engine.limits
    )  # retried alone, then ended
