"""The task pool: per-task attempts, pass-rate posteriors and lifecycle states, in SQLite.

The pool lives in the task set's index (``index.sqlite``) in tables of its own, so the factory's
tables and the curriculum's never collide. Every group of rollouts is recorded in ONE transaction
keyed by a unique ``group_id``: a crash (even ``kill -9``) leaves either the whole group or none of
it, and re-recording a group after a resume is a no-op, so counts stay consistent.

States: ``active``; ``retired_solved`` (solved in every one of its last K groups);
``retired_impossible`` (failed every rollout of its last K groups after enough attempts);
``quarantined_flagged`` (rollouts tripped the reward-hacking monitor repeatedly: the task may leak).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cadenza.errors import CadenzaError

STATES = ("active", "retired_solved", "retired_impossible", "quarantined_flagged")
INDEX_NAME = "index.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS pool_tasks (
    task_id TEXT PRIMARY KEY,
    source TEXT NOT NULL DEFAULT '',
    level INTEGER NOT NULL DEFAULT 1,
    state TEXT NOT NULL DEFAULT 'active',
    added_step INTEGER NOT NULL DEFAULT 0,
    state_step INTEGER,
    state_reason TEXT
);
CREATE TABLE IF NOT EXISTS pool_groups (
    group_id TEXT PRIMARY KEY,
    task_id TEXT NOT NULL REFERENCES pool_tasks(task_id),
    step INTEGER NOT NULL,
    n INTEGER NOT NULL,
    successes INTEGER NOT NULL,
    flagged INTEGER NOT NULL,
    ts REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS pool_attempts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    group_id TEXT NOT NULL REFERENCES pool_groups(group_id),
    task_id TEXT NOT NULL,
    step INTEGER NOT NULL,
    success INTEGER NOT NULL,
    reward REAL NOT NULL,
    flagged INTEGER NOT NULL,
    ts REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS pool_groups_task ON pool_groups(task_id, step);
CREATE TABLE IF NOT EXISTS pool_events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    step INTEGER NOT NULL,
    kind TEXT NOT NULL,
    detail TEXT NOT NULL,
    ts REAL NOT NULL
);
"""


@dataclass(kw_only=True)
class PoolConfig:
    """Posterior prior and lifecycle thresholds.

    ``prior_alpha``/``prior_beta``: Beta prior over a task's pass rate (1, 1 = uniform).
    ``retire_window``: K, the number of most recent groups that decide retirement.
    ``impossible_min_attempts``: never call a task impossible before this many rollouts.
    ``quarantine_min_flagged_groups``: groups with a flagged rollout before quarantine.
    """

    prior_alpha: float = 1.0
    prior_beta: float = 1.0
    retire_window: int = 3
    impossible_min_attempts: int = 24
    quarantine_min_flagged_groups: int = 2

    def __post_init__(self) -> None:
        if self.prior_alpha <= 0 or self.prior_beta <= 0:
            raise CadenzaError("pool prior_alpha and prior_beta must be > 0 (1, 1 is a uniform prior)")
        if self.retire_window < 1:
            raise CadenzaError("pool retire_window must be >= 1")


@dataclass(kw_only=True)
class TaskStats:
    task_id: str
    source: str
    level: int
    state: str
    attempts: int
    successes: int
    groups: int
    alpha: float
    beta: float

    @property
    def mean(self) -> float:
        """Posterior mean pass rate."""
        return self.alpha / (self.alpha + self.beta)


@dataclass(kw_only=True)
class AttemptResult:
    """One rollout's result as the pool needs it."""

    success: bool
    reward: float
    flagged: bool = False


class TaskPool:
    """SQLite-backed pool. Open one per process; writes are short transactions (WAL mode)."""

    def __init__(self, path: str | Path, config: PoolConfig | None = None) -> None:
        path = Path(path)
        if path.is_dir():
            path = path / INDEX_NAME
        if not path.parent.is_dir():
            raise CadenzaError(
                f"task set directory {path.parent} does not exist; build tasks first with 'cadenza "
                "tasks build'"
            )
        self.path = path
        self.config = config or PoolConfig()
        self._db = sqlite3.connect(path, timeout=30.0, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> TaskPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self):
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # -- membership -------------------------------------------------------------------------
    def add_tasks(self, tasks: Iterable[tuple[str, str, int]], step: int = 0) -> int:
        """Add ``(task_id, source, level)`` rows; existing ids are left as they are. Returns how many were
        new."""
        with self._tx() as db:
            before = db.total_changes
            db.executemany(
                "INSERT OR IGNORE INTO pool_tasks(task_id, source, level, added_step) VALUES (?, ?, ?, ?)",
                [(t, s, int(lv), step) for t, s, lv in tasks],
            )
            return db.total_changes - before

    def task_ids(self, state: str | None = "active") -> list[str]:
        if state is None:
            rows = self._db.execute("SELECT task_id FROM pool_tasks ORDER BY task_id")
        else:
            rows = self._db.execute(
                "SELECT task_id FROM pool_tasks WHERE state = ? ORDER BY task_id", (state,)
            )
        return [r[0] for r in rows]

    # -- recording --------------------------------------------------------------------------
    def record_group(self, task_id: str, group_id: str, step: int, rollouts: Sequence[AttemptResult]) -> bool:
        """Record one group of rollouts atomically; returns False if ``group_id`` was already recorded."""
        if not rollouts:
            raise CadenzaError(
                f"group {group_id} of task {task_id} has no rollouts; record groups with at least one"
            )
        now = time.time()
        with self._tx() as db:
            if db.execute("SELECT 1 FROM pool_tasks WHERE task_id = ?", (task_id,)).fetchone() is None:
                raise CadenzaError(f"task {task_id} is not in the pool; add it with TaskPool.add_tasks first")
            if db.execute("SELECT 1 FROM pool_groups WHERE group_id = ?", (group_id,)).fetchone():
                return False
            db.execute(
                "INSERT INTO pool_groups(group_id, task_id, step, n, successes, flagged, ts) VALUES "
                "(?,?,?,?,?,?,?)",
                (
                    group_id,
                    task_id,
                    step,
                    len(rollouts),
                    sum(r.success for r in rollouts),
                    sum(r.flagged for r in rollouts),
                    now,
                ),
            )
            db.executemany(
                "INSERT INTO pool_attempts(group_id, task_id, step, success, reward, flagged, ts) "
                "VALUES (?,?,?,?,?,?,?)",
                [
                    (group_id, task_id, step, int(r.success), float(r.reward), int(r.flagged), now)
                    for r in rollouts
                ],
            )
            self._update_state(db, task_id, step)
        return True

    def _update_state(self, db: sqlite3.Connection, task_id: str, step: int) -> None:
        state = db.execute("SELECT state FROM pool_tasks WHERE task_id = ?", (task_id,)).fetchone()[0]
        if state != "active":
            return
        k = self.config.retire_window
        recent = db.execute(
            "SELECT n, successes FROM pool_groups WHERE task_id = ? ORDER BY step DESC, ts DESC LIMIT ?",
            (task_id, k),
        ).fetchall()
        flagged_groups = db.execute(
            "SELECT COUNT(*) FROM pool_groups WHERE task_id = ? AND flagged > 0", (task_id,)
        ).fetchone()[0]
        attempts = db.execute(
            "SELECT COALESCE(SUM(n), 0) FROM pool_groups WHERE task_id = ?", (task_id,)
        ).fetchone()[0]
        new, reason = None, None
        if flagged_groups >= self.config.quarantine_min_flagged_groups:
            new, reason = "quarantined_flagged", f"{flagged_groups} groups tripped the monitor"
        elif len(recent) == k and all(s == n for n, s in recent):
            new, reason = "retired_solved", f"solved in all of its last {k} groups"
        elif (
            len(recent) == k
            and all(s == 0 for _, s in recent)
            and attempts >= self.config.impossible_min_attempts
        ):
            new, reason = "retired_impossible", f"no success in {attempts} attempts"
        if new:
            db.execute(
                "UPDATE pool_tasks SET state = ?, state_step = ?, state_reason = ? WHERE task_id = ?",
                (new, step, reason, task_id),
            )
            db.execute(
                "INSERT INTO pool_events(step, kind, detail, ts) VALUES (?, ?, ?, ?)",
                (step, new, json.dumps({"task_id": task_id, "reason": reason}), time.time()),
            )

    def log_event(self, step: int, kind: str, detail: dict[str, Any]) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO pool_events(step, kind, detail, ts) VALUES (?, ?, ?, ?)",
                (step, kind, json.dumps(detail), time.time()),
            )

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        q = (
            "SELECT step, kind, detail FROM pool_events"
            + (" WHERE kind = ?" if kind else "")
            + " ORDER BY id"
        )
        rows = self._db.execute(q, (kind,) if kind else ())
        return [{"step": s, "kind": k, **json.loads(d)} for s, k, d in rows]

    # -- reading ----------------------------------------------------------------------------
    def stats(self, state: str | None = None) -> list[TaskStats]:
        """Per-task counts and Beta posterior, optionally only tasks in ``state``."""
        q = """SELECT t.task_id, t.source, t.level, t.state,
                      COALESCE(SUM(g.n), 0), COALESCE(SUM(g.successes), 0), COUNT(g.group_id)
               FROM pool_tasks t LEFT JOIN pool_groups g ON g.task_id = t.task_id"""
        args: tuple = ()
        if state is not None:
            q += " WHERE t.state = ?"
            args = (state,)
        q += " GROUP BY t.task_id ORDER BY t.task_id"
        a0, b0 = self.config.prior_alpha, self.config.prior_beta
        return [
            TaskStats(
                task_id=t,
                source=s,
                level=lv,
                state=st,
                attempts=n,
                successes=k,
                groups=g,
                alpha=a0 + k,
                beta=b0 + n - k,
            )
            for t, s, lv, st, n, k, g in self._db.execute(q, args)
        ]

    def check_consistency(self) -> list[str]:
        """Invariants that a crash must never break; returns a list of violations (empty when sound)."""
        problems = []
        for gid, n, k, cnt, sk in self._db.execute(
            """SELECT g.group_id, g.n, g.successes, COUNT(a.id), COALESCE(SUM(a.success), 0)
               FROM pool_groups g LEFT JOIN pool_attempts a ON a.group_id = g.group_id GROUP BY g.group_id"""
        ):
            if n != cnt or k != sk:
                problems.append(f"group {gid}: header n={n}/succ={k} vs attempts {cnt}/{sk}")
        orphans = self._db.execute(
            "SELECT COUNT(*) FROM pool_attempts WHERE group_id NOT IN (SELECT group_id FROM pool_groups)"
        ).fetchone()[0]
        if orphans:
            problems.append(f"{orphans} attempts without a group")
        return problems
