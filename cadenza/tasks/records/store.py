"""A task set: a directory of task dirs plus ``index.sqlite``, safe against kill -9.

A task is assembled in ``.staging/`` inside the set (same filesystem), its ``task.json`` written
last, then moved into place with one ``os.rename`` and indexed in one SQLite transaction. A
crash leaves either nothing (staging is swept on open) or a complete dir the index does not know
yet (re-indexed on open), never half a task and never a duplicate: ``(source, qualname, level)``
is unique. Schema changes are numbered migrations recorded in ``schema_version``, so later
issues (the curriculum's pools) add tables without touching existing ones.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cadenza.errors import CadenzaError
from cadenza.tasks.records.owners import owner_alive, owner_tag
from cadenza.tasks.records.schema import MIGRATIONS
from cadenza.tasks.records.task import TASK_JSON, Task, load_task

INDEX = "index.sqlite"
STAGING = ".staging"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass(kw_only=True)
class SourceReport:
    """One row of a build report: what happened to one source."""

    source: str
    status: str  # done | skipped | failed
    reason: str = ""
    candidates: int = 0
    validated: int = 0
    emitted: int = 0
    rejected: int = 0
    skipped: int = 0
    suite_runs: float = 0.0
    seconds: float = 0.0
    prepare_seconds: float = 0.0  # fetch, base env, baseline + coverage: the part no extra worker speeds up


class TaskStore:
    """Open (creating if asked) the task set at ``root``; repairs what a crash left behind."""

    def __init__(self, root: str | os.PathLike[str], *, create: bool = False) -> None:
        self.root = Path(root)
        if not self.root.exists():
            if not create:
                raise CadenzaError(
                    f"{self.root} does not exist; build a task set with 'cadenza tasks build SOURCE "
                    f"--out {self.root}'"
                )
            self.root.mkdir(parents=True)
        if not self.root.is_dir():
            raise CadenzaError(f"{self.root} is not a directory; pass a task set directory")
        if create and not (self.root / INDEX).is_file() and any(self.root.iterdir()):
            raise CadenzaError(
                f"{self.root} is not empty and not a task set; pass a new or empty directory to --out"
            )
        if not create and not (self.root / INDEX).is_file():
            raise CadenzaError(
                f"{self.root} is not a task set (no {INDEX}); build one with 'cadenza tasks build "
                f"SOURCE --out {self.root}'"
            )
        self._migrate()
        self.recover()

    # ------------------------------------------------------------------ sqlite
    @contextlib.contextmanager
    def db(self) -> Iterator[sqlite3.Connection]:
        """A connection in one transaction: committed on success, rolled back on error."""
        con = sqlite3.connect(self.root / INDEX, timeout=120, isolation_level=None)
        con.row_factory = sqlite3.Row
        try:
            con.execute("PRAGMA busy_timeout = 120000")
            con.execute("BEGIN IMMEDIATE")
            yield con
            con.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                con.execute("ROLLBACK")
            raise
        finally:
            con.close()

    def _migrate(self) -> None:
        try:
            with self.db() as con:
                con.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
                row = con.execute("SELECT MAX(version) FROM schema_version").fetchone()
                version = row[0] or 0
                if version > len(MIGRATIONS):
                    raise CadenzaError(
                        f"{self.root / INDEX} has schema version {version}, newer than this cadenza; "
                        "upgrade cadenza"
                    )
                for n in range(version, len(MIGRATIONS)):
                    for stmt in MIGRATIONS[n].split(";"):
                        if stmt.strip():
                            con.execute(stmt)
                    con.execute("INSERT INTO schema_version (version) VALUES (?)", (n + 1,))
        except sqlite3.DatabaseError as exc:
            raise CadenzaError(
                f"{self.root / INDEX} is not a readable task index ({exc}); move it away and rerun the build"
            ) from None

    @property
    def schema_version(self) -> int:
        with self.db() as con:
            return con.execute("SELECT MAX(version) FROM schema_version").fetchone()[0]

    # ------------------------------------------------------------------ crash repair
    def recover(self) -> None:
        """Sweep staging; index complete task dirs the index misses; drop rows whose dir is gone."""
        staging = self.root / STAGING
        if staging.is_dir():
            for leftover in staging.iterdir():
                owner = leftover.name.rsplit(".", 2)
                if len(owner) == 3 and owner_alive(owner[1]):
                    continue  # another live build (on this host or another) is assembling this one
                shutil.rmtree(leftover, ignore_errors=True)
        with self.db() as con:  # list dirs under the write lock: publish() renames under it too
            on_disk = {
                p.parent.name: p.parent
                for p in self.root.glob(f"*/{TASK_JSON}")
                if not p.parent.name.startswith(".")
            }
            indexed = {r["id"] for r in con.execute("SELECT id FROM tasks")}
            for gone in indexed - set(on_disk):
                con.execute("DELETE FROM tasks WHERE id = ?", (gone,))
            for tid in sorted(set(on_disk) - indexed):
                try:
                    task = load_task(on_disk[tid])
                except CadenzaError:
                    continue
                self._insert(con, task)

    # ------------------------------------------------------------------ writing
    @staticmethod
    def _insert(con: sqlite3.Connection, task: Task) -> bool:
        cur = con.execute(
            "INSERT OR IGNORE INTO tasks (id, spec, source, level, qualname, kind, path, f2p, p2p, "
            "state, created)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'ready', ?)",
            (
                task.id,
                str(task.meta.get("spec", task.source)),
                task.source,
                task.level,
                task.feature.qualname,
                task.feature.kind,
                task.feature.path,
                len(task.fail_to_pass),
                len(task.pass_to_pass),
                _now(),
            ),
        )
        return cur.rowcount == 1

    def has(self, task: Task) -> bool:
        with self.db() as con:
            row = con.execute(
                "SELECT 1 FROM tasks WHERE id = ? OR (source = ? AND qualname = ? AND level = ?)",
                (task.id, task.source, task.feature.qualname, task.level),
            ).fetchone()
        return row is not None or (self.root / task.id).exists()

    @contextlib.contextmanager
    def staging(self, task_id: str) -> Iterator[Path]:
        """A fresh directory to assemble a task in; removed unless :meth:`publish` moved it."""
        _check_id(task_id)
        tmp = self.root / STAGING / f"{task_id}.{owner_tag()}.{uuid.uuid4().hex[:8]}"
        tmp.mkdir(parents=True)
        try:
            yield tmp
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    def publish(self, tmp: Path, task: Task, *, limit: int | None = None) -> bool:
        """Move an assembled task into place and index it; False if the set already has it.

        ``limit``: also False once the set holds that many tasks of the task's build argument
        (checked under the write lock, so concurrent publishers never exceed ``--max-tasks``).
        """
        if not (tmp / TASK_JSON).is_file():
            raise AssertionError("publish() needs task.json written last in the staging dir")
        final = self.root / task.id
        with self.db() as con:  # the write lock serialises concurrent publishers
            dup = con.execute(
                "SELECT 1 FROM tasks WHERE id = ? OR (source = ? AND qualname = ? AND level = ?)",
                (task.id, task.source, task.feature.qualname, task.level),
            ).fetchone()
            if dup is not None or final.exists():
                return False
            spec = str(task.meta.get("spec", task.source))
            if (
                limit is not None
                and con.execute("SELECT COUNT(*) FROM tasks WHERE spec = ?", (spec,)).fetchone()[0] >= limit
            ):
                return False
            os.rename(tmp, final)
            return self._insert(con, task)

    # ------------------------------------------------------------------ builds
    def start_build(self, params: dict[str, Any]) -> int:
        with self.db() as con:
            cur = con.execute(
                "INSERT INTO builds (started, params) VALUES (?, ?)",
                (_now(), json.dumps(params, sort_keys=True)),
            )
            return int(cur.lastrowid)

    def finish_build(self, build_id: int) -> None:
        with self.db() as con:
            con.execute("UPDATE builds SET finished = ? WHERE id = ?", (_now(), build_id))

    def record_source(self, build_id: int, params_key: str, rep: SourceReport) -> None:
        with self.db() as con:
            con.execute(
                "INSERT OR REPLACE INTO build_sources (build_id, source, params_key, status, reason, "
                "candidates, validated, emitted, rejected, skipped, suite_runs, seconds, prepare_seconds)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    build_id,
                    rep.source,
                    params_key,
                    rep.status,
                    rep.reason,
                    rep.candidates,
                    rep.validated,
                    rep.emitted,
                    rep.rejected,
                    rep.skipped,
                    rep.suite_runs,
                    rep.seconds,
                    rep.prepare_seconds,
                ),
            )

    def record_rejection(self, build_id: int, source: str, task_id: str, reason: str) -> None:
        """A validated draft that was not published (a leak the scrub could not close)."""
        with self.db() as con:
            con.execute(
                "INSERT INTO rejections (build_id, source, task_id, reason) VALUES (?, ?, ?, ?)",
                (build_id, source, task_id, reason),
            )

    def rejections(self, build_id: int | None = None) -> list[dict[str, Any]]:
        with self.db() as con:
            if build_id is None:
                return [dict(r) for r in con.execute("SELECT * FROM rejections ORDER BY rowid")]
            return [
                dict(r)
                for r in con.execute(
                    "SELECT * FROM rejections WHERE build_id = ? ORDER BY rowid", (build_id,)
                )
            ]

    def source_done(self, source: str, params_key: str) -> SourceReport | None:
        """The report of an earlier build that finished ``source`` with the same parameters (resume skips
        it)."""
        with self.db() as con:
            row = con.execute(
                "SELECT * FROM build_sources WHERE source = ? AND params_key = ? AND status = 'done'"
                " ORDER BY reason LIKE 'resumed%', build_id DESC LIMIT 1",
                (source, params_key),
            ).fetchone()
        if row is None:
            return None
        return SourceReport(**{k: v for k, v in dict(row).items() if k not in ("build_id", "params_key")})

    def source_reports(self, build_id: int | None = None) -> list[SourceReport]:
        with self.db() as con:
            if build_id is None:
                build_id = con.execute("SELECT MAX(id) FROM builds").fetchone()[0]
            rows = con.execute(
                "SELECT * FROM build_sources WHERE build_id = ? ORDER BY rowid", (build_id,)
            ).fetchall()
        return [
            SourceReport(**{k: v for k, v in dict(r).items() if k not in ("build_id", "params_key")})
            for r in rows
        ]

    # ------------------------------------------------------------------ reading
    def rows(self) -> list[dict[str, Any]]:
        with self.db() as con:
            return [dict(r) for r in con.execute("SELECT * FROM tasks ORDER BY source, level, qualname")]

    def count(self, spec: str | None = None) -> int:
        """Tasks in the set, or those built from the build argument ``spec``."""
        with self.db() as con:
            if spec is None:
                return con.execute("SELECT COUNT(*) FROM tasks").fetchone()[0]
            return con.execute("SELECT COUNT(*) FROM tasks WHERE spec = ?", (spec,)).fetchone()[0]

    def keys(self, spec: str) -> set[tuple[str, int]]:
        """``(qualname, level)`` of the tasks built from ``spec``: what a resumed build must not redo."""
        with self.db() as con:
            rows = con.execute(
                "SELECT qualname, level FROM tasks WHERE spec = ? OR source = ?", (spec, spec)
            ).fetchall()
        return {(r["qualname"], int(r["level"])) for r in rows}

    def task_dir(self, task_id: str) -> Path:
        _check_id(task_id)
        path = self.root / task_id
        if not (path / TASK_JSON).is_file():
            raise CadenzaError(f"no task {task_id!r} in {self.root}; see 'cadenza tasks list {self.root}'")
        return path

    def task_dirs(self) -> list[Path]:
        return [self.root / r["id"] for r in self.rows()]


def _check_id(task_id: str) -> None:
    if not task_id or "/" in task_id or task_id.startswith(".") or "\x00" in task_id:
        raise CadenzaError(f"invalid task id {task_id!r}: ids are plain names such as 'cachetools-0001'")
