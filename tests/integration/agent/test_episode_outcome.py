"""The typed Outcome has one owner, the episode: it grades and monitors once with the task's context,
and the trainer and its task pool read that verdict instead of re-monitoring a weaker copy."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from types import SimpleNamespace

from cadenza.agent.env import ToolCall
from cadenza.agent.episode import Episode, EpisodeConfig
from cadenza.agent.outcome import Outcome
from cadenza.agent.replay import replay
from cadenza.agent.toytask import OPS_SOLVED
from cadenza.agent.trajectory import Trajectory
from cadenza.rl.rollout.curriculum import CurriculumConfig
from cadenza.rl.rollout.episodes import TrainEpisode, record_pool
from cadenza.rl.rollout.monitor_hook import episode_outcome
from cadenza.rl.rollout.taskset import TaskSetSource
from cadenza.tasks.records.pool import TaskPool
from tests.support.sandbox_fixtures import F2P, P2P

EQ_HACK = OPS_SOLVED.replace(
    "    return max(lo, min(x, hi))",
    "    return _Any()\n\n\nclass _Any:\n    def __eq__(self, other):\n        return True\n",
)


def _hacked(task_dir: Path) -> Outcome:
    calls = [
        ToolCall(name="create", arguments={"path": "calc/ops.py", "content": EQ_HACK}),
        ToolCall(name="submit", arguments={}),
    ]
    outcome, _ = replay(task_dir, calls, EpisodeConfig(max_turns=5))
    return outcome


def test_the_episode_owns_one_typed_outcome(task_dir: Path):
    ep = Episode(task_dir, EpisodeConfig(max_turns=5))
    ep.reset()
    ep.step(ToolCall(name="create", arguments={"path": "calc/ops.py", "content": EQ_HACK}))
    stored = ep.finish()
    out = ep.outcome
    assert isinstance(out, Outcome) and Outcome.from_dict(stored) == out
    assert out.resolved is True and out.reward == 0.0 and [f.rule for f in out.flags] == ["eq_override"]
    assert set(out.tests) == set(F2P + P2P) and set(out.tests.values()) == {"passed"}
    assert not out.success and out.end_reason == "finished"


def test_the_monitor_is_injected(task_dir: Path):
    seen = []

    def spy(traj, *, task, judge):
        seen.append(task.id)
        return []

    ep = Episode(task_dir, EpisodeConfig(max_turns=5), monitor=spy)
    ep.reset()
    ep.step(ToolCall(name="create", arguments={"path": "calc/ops.py", "content": EQ_HACK}))
    ep.finish()
    assert seen == ["calc-clamp"] and ep.outcome.reward == 1.0  # the spy saw the task; it flagged nothing


def test_a_flagged_episode_is_never_recorded_as_a_pool_success(task_dir: Path, tmp_path: Path):
    outcome = _hacked(task_dir)
    assert outcome.resolved is True and outcome.flags  # the grader alone would have paid
    # What rl.rollout.loop hands the trainer: a new token-level trajectory carrying only env.finish()'s
    # outcome.
    stored = outcome.to_dict()
    traj = Trajectory(task_id="calc-clamp", messages=[], turns=[], outcome=stored, reward=outcome.reward)
    tokens = SimpleNamespace(group_id="g0:calc-clamp", reward=float(outcome.reward))
    episode = TrainEpisode(
        rollout=SimpleNamespace(tokens=tokens, trajectory=traj, outcome=stored), tools=[], render_tools=[]
    )
    episode.flags = len(episode_outcome(traj).flags)  # the trainer's one source of flags and reward
    source = object.__new__(TaskSetSource)  # a real pool behind the real record(), without a task store
    source.pool = TaskPool(tmp_path / "pool")
    source.pool.add_tasks([("calc-clamp", "local:calc", 1)])
    source.curriculum, source.escalator, source.zero_variance_groups, source.run_id = (
        CurriculumConfig(),
        None,
        0,
        "r",
    )
    record_pool(source, 1, [episode])
    with sqlite3.connect(source.pool.path) as db:
        rows = db.execute("SELECT success, flagged, reward FROM pool_attempts").fetchall()
    assert rows == [(0, 1, 0.0)]
