"""Curriculum with a scripted policy of known per-task success probabilities."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from cadenza.errors import CadenzaError
from cadenza.rl.rollout.curriculum import (
    CurriculumConfig,
    CurriculumSampler,
    Escalator,
    PoolExhausted,
    drop_zero_variance,
)
from cadenza.tasks.pool import AttemptResult, PoolConfig, TaskPool
from cadenza.tasks.pool_report import plot_pass_rates, stats_table

# Eleven tasks with pass probabilities 0.0, 0.1, ..., 1.0.
PROBS = {f"t{i:02d}": i / 10 for i in range(11)}


def run_scripted(pool, sampler, steps, batch=4, group=8, seed=0, probs=PROBS):
    rng = random.Random(seed)
    picked, dropped = [], 0
    for step in range(steps):
        tasks = sampler.sample(batch)
        picked += tasks
        groups = []
        for t in tasks:
            rewards = [float(rng.random() < probs[t]) for _ in range(group)]
            groups.append(rewards)
            pool.record_group(
                t, f"s{step}-{t}", step, [AttemptResult(success=r > 0, reward=r) for r in rewards]
            )
        _, d = drop_zero_variance(groups)
        dropped += d
    return picked, dropped


def test_sampler_concentrates_near_target_and_retires_solved(tmp_path):
    pool = TaskPool(tmp_path, PoolConfig(retire_window=3, impossible_min_attempts=24))
    pool.add_tasks([(t, "pypi:demo", 1) for t in PROBS])
    sampler = CurriculumSampler(pool, CurriculumConfig(target=0.5), seed=1)
    picked, dropped = run_scripted(pool, sampler, steps=40)
    late = picked[len(picked) // 2 :]
    near = sum(0.3 <= PROBS[t] <= 0.7 for t in late) / len(late)
    # Uniform sampling would give 5/11 ~ 0.45 of draws near the target.
    assert near > 0.75, f"only {near:.2f} of late draws were near the target"
    states = {s.task_id: s.state for s in pool.stats()}
    assert states["t10"] == "retired_solved"
    assert states["t00"] == "retired_impossible"
    assert all(states[t] == "active" for t in ("t04", "t05", "t06"))
    assert dropped > 0  # the all-success / all-failure groups were recognised
    assert pool.check_consistency() == []
    table = stats_table(pool)
    assert table.row_count >= 3
    png = plot_pass_rates(pool, tmp_path / "pass_rates.png")
    assert png.stat().st_size > 1000


def test_drop_zero_variance():
    keep, dropped = drop_zero_variance([[1, 1, 1], [0, 1, 0], [0, 0], [0.5, 0.25]])
    assert keep == [1, 3] and dropped == 2


def test_quarantine_on_repeated_flags(tmp_path):
    pool = TaskPool(tmp_path, PoolConfig(quarantine_min_flagged_groups=2))
    pool.add_tasks([("leaky", "src", 1), ("fine", "src", 1)])
    for step in range(2):
        pool.record_group(
            "leaky",
            f"g{step}",
            step,
            [AttemptResult(success=True, reward=0.0, flagged=True), AttemptResult(success=False, reward=0.0)],
        )
        pool.record_group(
            "fine",
            f"f{step}",
            step,
            [AttemptResult(success=True, reward=1.0), AttemptResult(success=False, reward=0.0)],
        )
    states = {s.task_id: s.state for s in pool.stats()}
    assert states == {"leaky": "quarantined_flagged", "fine": "active"}
    assert [e["task_id"] for e in pool.events("quarantined_flagged")] == ["leaky"]


def test_record_group_is_idempotent_and_validates(tmp_path):
    pool = TaskPool(tmp_path)
    pool.add_tasks([("a", "s", 1)])
    assert pool.record_group("a", "g", 0, [AttemptResult(success=True, reward=1.0)])
    assert not pool.record_group("a", "g", 0, [AttemptResult(success=True, reward=1.0)])
    assert pool.stats()[0].attempts == 1
    with pytest.raises(CadenzaError, match="not in the pool"):
        pool.record_group("zzz", "g2", 0, [AttemptResult(success=True, reward=1.0)])
    with pytest.raises(CadenzaError, match="no rollouts"):
        pool.record_group("a", "g3", 0, [])


def test_exhausted_pool_says_why(tmp_path):
    pool = TaskPool(tmp_path)
    with pytest.raises(PoolExhausted, match="pool is empty"):
        CurriculumSampler(pool).sample(2)
    pool.add_tasks([("a", "s", 1)])
    for i in range(3):
        pool.record_group("a", f"g{i}", i, [AttemptResult(success=True, reward=1.0)] * 2)
    with pytest.raises(PoolExhausted, match="retired_solved: 1"):
        CurriculumSampler(pool).sample(2)


def test_escalation_adds_harder_tasks_in_background(tmp_path):
    pool = TaskPool(tmp_path)
    pool.add_tasks([(f"e{i}", "pypi:easy", 1) for i in range(4)] + [("h0", "pypi:hard", 3)])
    made = []

    def factory(source, level, n):
        made.append((source, level))
        time.sleep(0.05)
        return [(f"{source}-L{level}-{j}", source, level) for j in range(n)]

    cfg = CurriculumConfig(escalate_min_groups=4, escalate_tasks=4, escalate_cooldown_steps=100)
    esc = Escalator(pool_path=str(pool.path), factory=factory, config=cfg)
    assert esc.maybe_escalate(pool, step=0) is None  # no evidence yet
    for i in range(4):
        pool.record_group(
            f"e{i}",
            f"g{i}",
            1,
            [AttemptResult(success=True, reward=1.0)] * 7 + [AttemptResult(success=False, reward=0.0)],
        )
    why = esc.maybe_escalate(pool, step=1)
    assert why is not None and "mean pass rate" in why
    esc.wait(10)
    results = esc.drain()
    assert [(r.source, r.level) for r in results] == [("pypi:easy", 2)] and results[0].added == 4
    assert made == [("pypi:easy", 2)]  # the hard source at max level is not asked again
    assert {s.level for s in pool.stats() if s.source == "pypi:easy"} == {1, 2}
    assert esc.maybe_escalate(pool, step=2) is None  # cooldown


def test_escalation_factory_failure_is_reported_not_raised(tmp_path):
    pool = TaskPool(tmp_path)
    pool.add_tasks([("e0", "pypi:x", 1)])

    def factory(source, level, n):
        raise CadenzaError("no level-2 candidates in pypi:x")

    esc = Escalator(pool_path=str(pool.path), factory=factory, config=CurriculumConfig(escalate_min_groups=1))
    pool.record_group("e0", "g", 0, [AttemptResult(success=True, reward=1.0)] * 4)
    assert esc.maybe_escalate(pool, step=0)
    esc.wait(10)
    (res,) = esc.drain()
    assert res.added == 0 and "no level-2 candidates" in res.error
    assert pool.events("escalation_done")[0]["error"].endswith("no level-2 candidates in pypi:x")


WRITER = textwrap.dedent("""
    import random, sys
    from cadenza.tasks.pool import AttemptResult, TaskPool
    pool = TaskPool(sys.argv[1])
    pool.add_tasks([(f"t{i}", "s", 1) for i in range(5)])
    for step in range(int(sys.argv[2])):
        for i in range(5):
            rng = random.Random(step * 100 + i)
            pool.record_group(f"t{i}", f"s{step}-t{i}", step,
                              [AttemptResult(success=rng.random() < 0.5, reward=1.0) for _ in range(16)])
        print(step, flush=True)
""")


def test_kill_9_mid_step_keeps_counts_consistent(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    db = tmp_path / "set"
    db.mkdir()
    proc = subprocess.Popen(
        [sys.executable, str(script), str(db), "100000"], stdout=subprocess.PIPE, text=True, env=env
    )
    for _ in range(30):  # let it record a few steps, then kill it mid-write
        proc.stdout.readline()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    pool = TaskPool(db)
    assert pool.check_consistency() == []
    before = {s.task_id: s.attempts for s in pool.stats()}
    assert all(v % 16 == 0 for v in before.values())
    pool.close()
    # Resume: rerunning the same steps records only what is missing.
    subprocess.run([sys.executable, str(script), str(db), "40"], check=True, capture_output=True, env=env)
    pool = TaskPool(db)
    assert pool.check_consistency() == []
    after = pool.stats()
    assert all(s.attempts == max(40, before[s.task_id] // 16) * 16 for s in after)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("target", 1.0, r"target must be in \(0, 1\)"),
        ("confirm_share", 1.5, r"confirm_share must be in \[0, 1\], got 1.5"),
        ("near_band", -0.1, r"near_band must be in \[0, 1\]"),
        ("escalate_tasks", -1, "escalate_tasks must be an integer >= 0, got -1"),
        ("max_level", 2.5, "max_level must be an integer >= 0, got 2.5"),
    ],
)
def test_config_names_the_bad_field(field: str, value: object, message: str) -> None:
    with pytest.raises(CadenzaError, match=message):
        CurriculumConfig(**{field: value})
