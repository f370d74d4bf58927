"""The whole pipeline at its smallest: toy task set -> warm-started tiny policy -> RL over the task pool.

Real sandboxed episodes, grading, monitor, feedback, GRPO + SD and the SQLite pool; the escalation test
asks the real task factory for harder tasks from a real project (a local one: the factory's PyPI sources
are tests/integration/tasks/test_build.py's).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from cadenza.agent.toytask import make_task
from cadenza.rl.rollout.curriculum import CurriculumConfig, Escalator, PoolExhausted
from cadenza.rl.rollout.taskset import factory_for
from cadenza.rl.train.demo import DemoConfig, report_table, run_demo
from cadenza.tasks.records.pool import AttemptResult, TaskPool
from cadenza.tasks.records.store import TaskStore
from cadenza.tasks.records.task import load_task, save_task
from tests.support.tasks_helpers import make_repo, shared_env_cache


def toy_task_set(root: Path, env: Path, names: list[str]) -> Path:
    """An indexed task set of copies of the built-in toy task (distinct sources, so the index keeps each)."""
    store = TaskStore(root, create=True)
    scratch = root.parent / f"{root.name}-scratch"
    for name in names:
        src = make_task(scratch, name, env)
        with store.staging(name) as tmp:
            shutil.copytree(src, tmp, dirs_exist_ok=True)
            task = load_task(tmp)
            task.source = f"local:calc-{name}"
            save_task(tmp, task)
            assert store.publish(tmp, task)
    shutil.rmtree(scratch)
    return root


def assert_weights_moved(start: Path, run_dir: Path) -> None:
    from safetensors.torch import load_file

    before = load_file(next(start.glob("*.safetensors")))
    (final,) = sorted((run_dir / "checkpoints").glob("step-*"))[-1:]
    after = load_file(final / "model.safetensors")
    shared = sorted(set(before) & set(after))
    assert shared, (sorted(before)[:3], sorted(after)[:3])
    assert any(not before[k].equal(after[k]) for k in shared), "no parameter changed during training"


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory, task_env: Path):
    base = tmp_path_factory.mktemp("pipeline")
    task_set = toy_task_set(base / "tasks", task_env, ["calc-a", "calc-b", "calc-c"])
    cfg = DemoConfig(
        out=base / "run",
        task_set=task_set,
        steps=2,
        tasks_per_step=2,
        group_size=2,
        max_turns=3,  # enough turns (and warm-up) for tool mistakes that the feedback hints at
        max_new_tokens=24,
        transcripts=60,
        sft_steps=20,
        vocab_size=400,
        escalate=False,
    )
    return cfg, run_demo(cfg, log=lambda m: None)


def test_pipeline_records_every_rollout_and_logs_pool_metrics(demo_run) -> None:
    cfg, result = demo_run
    rows = result.rows
    assert [r["step"] for r in rows] == [1, 2]
    db = sqlite3.connect(result.task_set / "index.sqlite")
    groups = db.execute("SELECT step, task_id, n, successes FROM pool_groups ORDER BY step").fetchall()
    # every rollout of every step is in the pool, one group per (step, task)
    assert sum(n for _, _, n, _ in groups) == cfg.steps * cfg.tasks_per_step * cfg.group_size
    for step in (1, 2):
        mine = [g for g in groups if g[0] == step]
        assert len(mine) == cfg.tasks_per_step and all(n == cfg.group_size for _, _, n, _ in mine)
        row = rows[step - 1]
        # zero-variance groups the trainer dropped == all-success/all-failure groups the pool recorded
        assert row["zero_variance_groups"] == sum(k in (0, n) for _, _, n, k in mine)
        assert row["resolved_rate"] == pytest.approx(sum(k for *_, k in mine) / sum(n for *_, n, _ in mine))
    attempts = db.execute("SELECT COUNT(*) FROM pool_attempts").fetchone()[0]
    assert attempts == len(rows) * cfg.tasks_per_step * cfg.group_size
    for key in (
        "pool_active",
        "pool_mean_pass",
        "zero_variance_groups_total",
        "escalation_added",
        "escalation_failed",
        "sd_loss",
        "invalid_tool_rate",
    ):
        assert key in rows[-1], key
    assert rows[-1]["zero_variance_groups_total"] == sum(r["zero_variance_groups"] for r in rows)
    # The run really trained: every step took an optimizer step, SD on the tokens of hinted turns, and the
    # weights moved away from the warm-started policy. (GRPO has no signal at this scale: the warm-up
    # transcripts never edit, so every group's rewards tie. GRPO's own updates are checked where rewards
    # differ: toolworld, in tests/integration/experiments/test_tool_hints_experiment.py.)
    assert not any(r["skipped_update"] for r in rows) and all(r["grad_norm"] > 0 for r in rows), rows
    assert all(r["sd_tokens"] > 0 and r["hinted_turns"] > 0 and r["sd_loss"] > 0 for r in rows), rows
    assert_weights_moved(result.model_dir, result.run_dir)
    assert result.plot.is_file() and result.plot.stat().st_size > 1000
    assert (result.run_dir / "metrics.jsonl").is_file()
    from rich.console import Console

    console = Console(record=True, width=200)
    console.print(report_table(rows))
    assert "0-var groups" in console.export_text()


def test_tasks_stats_cli(demo_run, tmp_path: Path) -> None:
    _, result = demo_run
    png = tmp_path / "rates.png"
    out = subprocess.run(
        [sys.executable, "-m", "cadenza", "tasks", "stats", str(result.task_set), "--plot", str(png)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    with TaskPool(result.task_set) as pool:
        stats = pool.stats()
    attempts = sum(s.attempts for s in stats)
    assert "active" in out.stdout and str(attempts) in out.stdout
    assert png.is_file()
    bad = subprocess.run(
        [sys.executable, "-m", "cadenza", "tasks", "stats", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "error:" in bad.stderr and "Traceback" not in bad.stderr


def test_training_stops_with_a_clear_message_when_the_pool_is_exhausted(demo_run, tmp_path: Path) -> None:
    from cadenza.rl.train.trainer import Trainer

    _, result = demo_run
    empty = tmp_path / "empty"
    TaskStore(empty, create=True)
    from cadenza.rl.train.demo import train_config

    tc = train_config(DemoConfig(out=tmp_path / "run", steps=1, escalate=False), empty, result.model_dir)
    tc.run.progress = False
    with pytest.raises(PoolExhausted, match="training stopped after step 0: no active task"):
        Trainer(tc).train()


@pytest.mark.slow
@pytest.mark.network
def test_escalation_through_the_real_factory_adds_harder_tasks(
    tmp_path: Path, tmp_path_factory, monkeypatch
) -> None:
    """A pool whose minilib tasks have gone easy asks the real factory for level 2 from the same source."""
    monkeypatch.setenv("CADENZA_ENV_CACHE", str(shared_env_cache(tmp_path_factory)))
    source = str(make_repo(tmp_path / "minilib"))
    root = tmp_path / "set"
    TaskStore(root, create=True)
    with TaskPool(root) as pool:
        pool.add_tasks([("easy", source, 1)])
        for step in range(1, 4):
            pool.record_group(
                "easy",
                f"g{step}",
                step,
                [AttemptResult(success=True, reward=1.0)] * 3 + [AttemptResult(success=False, reward=0.0)],
            )
        esc = Escalator(
            pool_path=str(pool.path),
            factory=factory_for(root),
            config=CurriculumConfig(escalate_min_groups=1, escalate_tasks=1),
        )
        assert esc.maybe_escalate(pool, 3) is not None
        esc.wait(timeout=900)
        (res,) = esc.drain()
        assert res.error is None and res.added >= 1, res
        new = [s for s in pool.stats() if s.task_id != "easy"]
    assert new and all(s.level == 2 and s.source == source for s in new)
    for s in new:  # real, indexed task directories at the asked level
        data = json.loads((root / s.task_id / "task.json").read_text())
        assert data["level"] == 2 and data["fail_to_pass"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--model", "/nonexistent/ckpt"], "--model"),
        (["--device", "nonsense"], "--device"),
        (["--group-size", "1"], "--group-size"),
    ],
)
def test_demo_bad_input_is_one_line(demo_run, tmp_path: Path, args: list[str], needle: str) -> None:
    _, result = demo_run
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "cadenza",
            "demo",
            "--out",
            str(tmp_path),
            "--task-set",
            str(result.task_set),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and needle in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert not (tmp_path / "toolworld").exists()  # refused before the toolworld phase's warm-up started


def test_train_cli_over_a_task_set(demo_run, tmp_path: Path) -> None:
    """`cadenza train CONFIG.toml` with ``[env] name = "taskset"``: the pool grows by one step's rollouts."""
    import tomli_w

    from cadenza.metrics import read_metrics
    from cadenza.rl.train.demo import train_config

    _, result = demo_run
    task_set = shutil.copytree(result.task_set, tmp_path / "set")  # the module's run stays as it was
    with TaskPool(task_set) as pool:
        before = sum(s.attempts for s in pool.stats())
    tc = train_config(
        DemoConfig(
            out=tmp_path / "run",
            steps=1,
            tasks_per_step=1,
            group_size=2,
            max_turns=1,
            max_new_tokens=16,
            escalate=False,
        ),
        task_set,
        result.model_dir,
    )
    tc.run.progress = False
    (tmp_path / "train.toml").write_text(tomli_w.dumps(tc.to_dict()))
    out = subprocess.run(
        [sys.executable, "-m", "cadenza", "train", str(tmp_path / "train.toml")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    (row,) = read_metrics(tmp_path / "run" / "train" / "metrics.jsonl")
    with TaskPool(task_set) as pool:
        after = sum(s.attempts for s in pool.stats())
    assert after - before == 2 and row["pool_active"] >= 1 and "zero_variance_groups" in row
