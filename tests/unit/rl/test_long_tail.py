"""Long-tail control: a step draws extra GRPO groups and ends once enough have finished; the slow groups
are cut whole (never split), counted, and nobody waits for their sandbox calls (or, on a served engine,
for their generation in flight). Off (the default), nothing changes."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from cadenza.agent.env import StepResult
from cadenza.errors import ConfigError
from cadenza.rl.config import RolloutConfig, validate_long_tail
from cadenza.rl.engines.policy import Sample
from cadenza.rl.rollout.longtail import CutCounts, step_groups
from cadenza.rl.rollout.loop import RolloutParams, RolloutTask, rollout
from tests.support.rl_helpers import CounterEnv, make_tokenizer

SLOW_S = 3.0


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


class Steps(CounterEnv):
    """Done after ``steps`` tool calls, each taking ``delay`` seconds; records whether it was graded or
    closed."""

    def __init__(self, steps: int, delay: float = 0.0, finish_s: float = 0.0) -> None:
        super().__init__(target=99)
        self.steps, self.delay, self.finish_s, self.calls = steps, delay, finish_s, 0
        self.graded = self.closed = False

    def step(self, call):
        time.sleep(self.delay)
        self.calls += 1
        return StepResult(observation=f"call {self.calls}", done=self.calls >= self.steps)

    def finish(self):
        time.sleep(self.finish_s)
        self.graded = True
        return {"reward": float(self.calls), "resolved": True}

    def close(self):
        self.closed = True


class Echo:
    """Answers every prompt with one tool call; a batch whose prompts are all past their first turn
    (more end-of-turn tokens than the first prompt had) takes ``deep_s`` (a long generation)."""

    def __init__(self, tok, *, name: str, fixed: bool, deep_s: float = 0.0) -> None:
        self.ids = [*tok.encode('<tool_call>\n{"name": "add", "arguments": {"x": 1}}\n</tool_call>'),
                    tok.eos_token_id]  # fmt: skip
        self.name, self.fixed_batches, self.deep_s, self.eos = name, fixed, deep_s, tok.eos_token_id
        self.returned = threading.Event()
        self.base: int | None = None

    def sample(self, request):
        ends = [sum(t == self.eos for t in p) for p in request.prompts]
        self.base = min(ends) if self.base is None else self.base
        if self.deep_s and all(n > self.base for n in ends):
            time.sleep(self.deep_s)
            self.returned.set()
        return [Sample(token_ids=list(self.ids), logprobs=[-0.5] * len(self.ids), finish_reason="stop")
                for _ in request.prompts]  # fmt: skip


def _tasks(envs: list[list[Steps]]) -> list[RolloutTask]:
    """One task per row of ``envs``; each of its episodes gets the next env of its row."""
    return [
        RolloutTask(task_id=f"t{i}", make_env=lambda row=iter(row): next(row)) for i, row in enumerate(envs)
    ]


def _groups(out) -> Counter:
    return Counter(r.tokens.group_id for r in out)


@pytest.mark.parametrize("fixed", [False, True], ids=["served", "in-process"])
def test_a_slow_sandbox_is_cut_and_the_step_ends_without_it(tok, fixed):
    """Four groups of two, one episode with a 3 s sandbox call: with 3 groups needed the rollout returns
    at once with the 3 fast groups whole and that group (two episodes, one finished) cut; the slow
    episode is closed, not graded, once its call returns. (The in-process engine batches every live
    episode's next turn together, so there a slow call holds back the others' next turn: its episodes
    here end after one call.)"""
    steps = 1 if fixed else 2
    envs = [[Steps(steps) for _ in range(2)] for _ in range(4)]
    envs[1] = [Steps(steps, delay=SLOW_S), Steps(steps)]  # one slow episode holds its whole group back
    cut = CutCounts()
    cfg = RolloutParams(group_size=2, max_turns=4, max_new_tokens=40)
    t0 = time.monotonic()
    out = rollout(Echo(tok, name="vllm" if not fixed else "hf", fixed=fixed), tok, _tasks(envs), cfg,
                  seed=1, finish_groups=3, cut=cut)  # fmt: skip
    took = time.monotonic() - t0
    assert took < SLOW_S - 1.0, took
    assert _groups(out) == {"0:t0": 2, "2:t2": 2, "3:t3": 2}  # every kept group whole, in task order
    assert (cut.groups_cut, cut.episodes_cut) == (1, 2)
    assert all(r.trajectory.meta["stop_reason"] == "env_done" for r in out)
    assert all(e.graded for row in (envs[0], envs[2], envs[3]) for e in row)
    slow = envs[1][0]
    deadline = time.monotonic() + SLOW_S + 5
    while not slow.closed and time.monotonic() < deadline:
        time.sleep(0.05)
    assert slow.closed and not slow.graded and slow.calls == 1  # ended at its next turn, not graded


def test_a_generation_in_flight_for_cut_episodes(tok):
    """The slow group needs more turns, and its later turns are long generations: a served engine's
    batch in flight is abandoned (the rollout returns before it does); an in-process engine's batch,
    which shares the trainer's model, is waited for and its samples dropped."""
    for fixed in (False, True):
        # the fast groups' grading takes 0.5 s, so the slow group's second turn is at the engine first
        envs = [[Steps(1, finish_s=0.5) for _ in range(2)] for _ in range(3)]
        envs[2] = [Steps(4), Steps(4)]
        engine = Echo(tok, name="hf" if fixed else "vllm", fixed=fixed, deep_s=SLOW_S)
        cut = CutCounts()
        cfg = RolloutParams(group_size=2, max_turns=4, max_new_tokens=40)
        t0 = time.monotonic()
        out = rollout(engine, tok, _tasks(envs), cfg, seed=1, finish_groups=2, cut=cut)
        took = time.monotonic() - t0
        assert _groups(out) == {"0:t0": 2, "1:t1": 2} and (cut.groups_cut, cut.episodes_cut) == (1, 2)
        if fixed:
            assert engine.returned.is_set() and took >= SLOW_S
        else:
            assert not engine.returned.is_set() and took < SLOW_S - 1.0, took
        engine.returned.wait(SLOW_S + 5)


def test_off_is_the_old_loop(tok):
    """``finish_groups`` 0 or equal to the number of tasks: every group comes back, nothing is counted,
    and the samples are those of a rollout without the argument."""
    cfg = RolloutParams(group_size=2, max_turns=3, max_new_tokens=40)

    def run(**kw):
        envs = [[Steps(2) for _ in range(2)] for _ in range(3)]
        return rollout(Echo(tok, name="hf", fixed=True), tok, _tasks(envs), cfg, seed=1, **kw)

    ref = run()
    for finish in (0, 3):
        cut = CutCounts()
        out = run(finish_groups=finish, cut=cut)
        assert [r.tokens.input_ids for r in out] == [r.tokens.input_ids for r in ref]
        assert cut == CutCounts()
    assert step_groups(4, 0, 0) == (4, 4)  # the trainer's default: no extra group, no cut


def test_config_errors_are_one_line():
    validate_long_tail(RolloutConfig(tasks_per_step=4, oversample_groups=2))
    validate_long_tail(RolloutConfig(tasks_per_step=4, min_finished_groups=3))
    bad = [
        (dict(oversample_groups=-1), "oversample_groups must be >= 0"),
        (dict(oversample_groups=1, min_finished_groups=6), r"min_finished_groups = 6 must be in \[0, 5\]"),
        (dict(oversample_groups=1, executor="ray"), "need executor = 'local'"),
    ]
    for kw, match in bad:
        with pytest.raises(ConfigError, match=match) as info:
            validate_long_tail(RolloutConfig(tasks_per_step=4, **kw))
        assert "\n" not in str(info.value)
