"""``cadenza tasks build``: many sources into one task set, in parallel, resumable.

The core pipeline (:func:`cadenza.tasks.pipeline.iter_task_drafts`) yields validated drafts for
one source; this module turns each draft into a published task (copy, scrub, light environment,
leak scan, atomic publish) and runs sources in worker processes with a rich progress bar; spare
workers validate candidates of one source in parallel (:mod:`cadenza.tasks.parallel`). A
source that fails is one row with a one-line reason in the build report; a draft with leak
findings is dropped, never published.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing as mp
import os
import queue as queue_mod
import shutil
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cadenza.errors import CadenzaError
from cadenza.tasks.scan import Finding, scan_tasks
from cadenza.tasks.scrub import scrub_env, scrub_workspace
from cadenza.tasks.secret import derive_secret
from cadenza.tasks.store import SourceReport, TaskStore, pid_alive
from cadenza.tasks.task import GOLD_PATCH, WORKSPACE, save_task

if TYPE_CHECKING:
    from cadenza.tasks.pipeline import TaskDraft

ENV_DIR = "env"
WORK = ".work"  # pristine source copies and candidates while a source builds; never left behind


@dataclass(kw_only=True)
class BuildConfig:
    """Options of one build; ``params_key`` identifies them so a rerun resumes finished sources."""

    out: Path
    workers: int = 1
    max_tasks: int | None = None  # per source
    levels: tuple[int, ...] = (1, 2, 3)
    seed: int = 0
    statement_llm: str | None = None
    progress: bool = True

    def params_key(self) -> str:
        key = {
            "max_tasks": self.max_tasks,
            "levels": sorted(self.levels),
            "seed": self.seed,
            "llm": self.statement_llm,
        }
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(kw_only=True)
class BuildSummary:
    out: Path
    reports: list[SourceReport]
    tasks: list[dict[str, Any]]
    seconds: float
    rejections: list[dict[str, Any]] = field(default_factory=list)


@dataclass(kw_only=True)
class Published:
    status: str  # added | exists | leak | full
    task_id: str
    findings: list[Finding] = field(default_factory=list)


# --------------------------------------------------------------------------- one draft -> one task


def publish_draft(
    store: TaskStore, draft: TaskDraft, spec: str | None = None, *, limit: int | None = None
) -> Published:
    """Copy, scrub, give an environment, scan, and atomically publish one validated draft.

    ``limit``: at most that many tasks of ``spec`` in the set (status ``full`` once reached).
    """
    from cadenza.tasks.venv import make_task_env

    task = draft.task
    task.meta["spec"] = spec or task.meta.get("spec") or task.source
    if store.has(task):
        return Published(status="exists", task_id=task.id)
    workspace, gold, base_env = Path(draft.workspace), draft.gold_patch, draft.base_env
    with store.staging(task.id) as tmp:
        ws = tmp / WORKSPACE
        shutil.copytree(workspace, ws, symlinks=True)
        (tmp / GOLD_PATCH).write_text(gold)
        secret = derive_secret(task.id, ws, gold)
        scrub_workspace(ws, secret)
        make_task_env(base_env, ws, tmp / ENV_DIR)
        scrub_env(tmp / ENV_DIR, task.package, secret)
        task.env = ENV_DIR
        save_task(tmp, task)  # last: a staged dir without task.json is never published
        findings = scan_tasks([tmp])
        if findings:
            return Published(status="leak", task_id=task.id, findings=findings)
        added = store.publish(tmp, task, limit=limit)
    if not added and limit is not None and not store.has(task):
        return Published(status="full", task_id=task.id)
    return Published(status="added" if added else "exists", task_id=task.id)


# --------------------------------------------------------------------------- one source


def _prepare(spec: str, work_dir: Path, cfg: BuildConfig, stats: Any, skip: set[tuple[str, int]]) -> Any:
    from cadenza.tasks.pipeline import SourceConfig, prepare_source

    # No max_tasks here: drafts the scan rejects must not count, so the caller stops once the
    # set has enough tasks of this source.
    config = SourceConfig(levels=tuple(cfg.levels), seed=cfg.seed, llm_url=cfg.statement_llm)
    return prepare_source(
        spec, work_dir, levels=tuple(cfg.levels), seed=cfg.seed, config=config, stats=stats, skip=skip
    )


def _new_stats(spec: str) -> Any:
    from cadenza.tasks.pipeline import BuildStats

    return BuildStats(source=spec)


def build_source(
    spec: str, cfg: BuildConfig, events: Any = None, build_id: int | None = None, workers: int = 1
) -> SourceReport:
    """Build the tasks of one source into the set; never raises for a bad source.

    The shared work runs once here; ``workers`` processes then validate candidates, and drafts
    are published in candidate order, so the set does not depend on ``workers``. Candidates whose
    task the set already holds (a resumed build) are skipped before any test runs.
    """
    from cadenza.tasks.parallel import iter_attempts
    from cadenza.tasks.pipeline import record_attempt

    t0 = time.monotonic()
    store = TaskStore(cfg.out)
    rep = SourceReport(source=spec, status="done")
    work = cfg.out / WORK / f"{hashlib.sha256(spec.encode()).hexdigest()[:12]}.{os.getpid()}"
    emit = events.put if events is not None else (lambda _msg: None)
    attempts = None
    stats = _new_stats(spec)
    try:
        have = store.count(spec)
        if cfg.max_tasks is None or have < cfg.max_tasks:
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            plan = _prepare(spec, work, cfg, stats, store.keys(spec))
            emit(("plan", spec, len(plan.ordered), stats.skipped))
            attempts = iter_attempts(
                plan, work, workers, need=None if cfg.max_tasks is None else (lambda: cfg.max_tasks - have)
            )
            for att in attempts:
                record_attempt(stats, att)
                emit(("tried", spec, stats.tried, stats.validated))
                if att.draft is None:
                    continue
                res = publish_draft(store, att.draft, spec, limit=cfg.max_tasks)
                shutil.rmtree(Path(att.draft.workspace).parent, ignore_errors=True)  # the candidate dir
                if res.status == "added":
                    rep.emitted += 1
                    have += 1
                    emit(("task", spec, res.task_id))
                elif res.status == "leak":
                    rep.rejected += 1
                    if build_id is not None:
                        f = res.findings[0]
                        store.record_rejection(
                            build_id,
                            spec,
                            res.task_id,
                            f"leak ({len(res.findings)} finding(s)): {f.channel} {f.path}: {f.evidence}",
                        )
                    emit(("leak", spec, res.task_id, [asdict(f) for f in res.findings[:3]]))
                elif res.status == "full":
                    break  # another publisher filled this source's quota
                if cfg.max_tasks is not None and have >= cfg.max_tasks:
                    break
    except CadenzaError as exc:
        rep.status, rep.reason = "skipped", str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    except Exception as exc:  # one bad source never stops the others
        rep.status, rep.reason = (
            "failed",
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300],
        )
    finally:
        if attempts is not None:
            with contextlib.suppress(Exception):
                attempts.close()
        shutil.rmtree(work, ignore_errors=True)
    rep.candidates, rep.validated, rep.skipped = stats.tried, stats.validated, stats.skipped
    rep.suite_runs = round(stats.full_suite_runs, 2)
    rep.seconds = round(time.monotonic() - t0, 2)
    emit(("source", spec, asdict(rep)))
    return rep


_EVENTS: Any = None  # a source worker's progress queue, set once per process by _init_worker


def _init_worker(events: Any, parent: int) -> None:
    from cadenza.tasks.parallel import exit_with_parent

    global _EVENTS
    _EVENTS = events
    exit_with_parent(parent)


def _worker(spec: str, cfg: BuildConfig, events: Any, build_id: int, workers: int = 1) -> SourceReport:
    rep = build_source(spec, cfg, events if events is not None else _EVENTS, build_id, workers)
    TaskStore(cfg.out).record_source(build_id, cfg.params_key(), rep)
    return rep


# --------------------------------------------------------------------------- many sources


def sweep_work(out: Path) -> None:
    """Remove work dirs of dead builds: they hold the original source, which must not outlive a build."""
    work = Path(out) / WORK
    if work.is_dir():
        for d in work.iterdir():
            pid = d.name.rsplit(".", 1)[-1]
            if not (pid.isdigit() and pid_alive(int(pid))):
                shutil.rmtree(d, ignore_errors=True)


def build_tasks(sources: Sequence[str], cfg: BuildConfig, *, console: Any = None) -> BuildSummary:
    """Build every source into ``cfg.out``; finished sources of an earlier run are not redone."""
    if not sources:
        raise CadenzaError("no sources given; pass e.g. 'pypi:cachetools' or a path to a Python project")
    if cfg.workers < 1:
        raise CadenzaError(f"--workers must be at least 1, got {cfg.workers}")
    bad = [lv for lv in cfg.levels if lv not in (1, 2, 3)]
    if bad or not cfg.levels:
        raise CadenzaError(
            f"--levels must be a subset of 1,2,3, got {','.join(map(str, cfg.levels)) or 'nothing'}"
        )
    if cfg.max_tasks is not None and cfg.max_tasks < 1:
        raise CadenzaError(f"--max-tasks must be at least 1, got {cfg.max_tasks}")
    t0 = time.monotonic()
    cfg.out = Path(cfg.out).resolve()
    store = TaskStore(cfg.out, create=True)
    sweep_work(cfg.out)
    key = cfg.params_key()
    build_id = store.start_build({**asdict(cfg), "out": str(cfg.out), "sources": list(sources)})
    todo = []
    for s in dict.fromkeys(sources):
        if store.source_done(s, key) is None:
            todo.append(s)
        else:  # this run's numbers: nothing tried
            store.record_source(
                build_id,
                key,
                SourceReport(source=s, status="done", reason="resumed: finished in an earlier build"),
            )
    if todo:
        _run_parallel(todo, cfg, build_id, console)
    store.finish_build(build_id)
    return BuildSummary(
        out=cfg.out,
        reports=store.source_reports(build_id),
        tasks=store.rows(),
        seconds=round(time.monotonic() - t0, 2),
        rejections=store.rejections(build_id),
    )


def split_workers(workers: int, n_sources: int) -> list[int]:
    """Candidate workers per source process: sources first, spare workers go to candidates.

    ``[2, 1]`` means two source processes, the first validating with two candidate workers; a
    single entry means sources run one after the other in this process.
    """
    procs = max(1, min(workers, n_sources))
    return [workers // procs + (i < workers % procs) for i in range(procs)]


def _run_parallel(todo: list[str], cfg: BuildConfig, build_id: int, console: Any) -> list[SourceReport]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    ctx = mp.get_context("spawn")
    events = ctx.Queue()  # handed to source workers at start (no manager process to orphan on kill -9)
    per_source = cfg.max_tasks
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[note]}"),
        TimeElapsedColumn(),
        console=console,
        disable=not cfg.progress,
        transient=False,
    )
    reports: list[SourceReport] = []
    with progress:
        overall = progress.add_task("sources", total=len(todo), note="")
        bars = {s: progress.add_task(s[-40:], total=per_source, note="") for s in todo}
        stop = threading.Event()

        def drain() -> None:
            while not stop.is_set():
                try:
                    msg = events.get(timeout=0.2)
                except (queue_mod.Empty, EOFError, OSError):
                    continue
                kind, spec = msg[0], msg[1]
                if kind == "task":
                    progress.advance(bars[spec])
                elif kind == "plan":
                    skipped = f", {msg[3]} already in the set" if msg[3] else ""
                    progress.update(bars[spec], note=f"{msg[2]} candidates{skipped}")
                elif kind == "tried":
                    progress.update(bars[spec], note=f"validated {msg[3]} of {msg[2]} tried")
                elif kind == "leak":
                    progress.update(bars[spec], note=f"[yellow]dropped {msg[2]} (leak)")
                elif kind == "source":
                    rep = msg[2]
                    note = (
                        f"[green]{rep['emitted']} tasks"
                        if rep["status"] == "done"
                        else f"[red]{rep['status']}: {rep['reason'][:60]}"
                    )
                    progress.update(
                        bars[spec],
                        total=max(rep["emitted"], 1) if per_source is None else per_source,
                        completed=rep["emitted"]
                        if per_source is None or rep["status"] != "done"
                        else per_source,
                        note=note,
                    )
                    progress.advance(overall)

        drainer = threading.Thread(target=drain, daemon=True)
        drainer.start()
        try:
            per = split_workers(cfg.workers, len(todo))
            if len(per) == 1:
                reports = [_worker(s, cfg, events, build_id, per[0]) for s in todo]
            else:
                with ProcessPoolExecutor(
                    max_workers=len(per),
                    mp_context=ctx,
                    initializer=_init_worker,
                    initargs=(events, os.getpid()),
                ) as pool:
                    futures = [
                        pool.submit(_worker, s, cfg, None, build_id, per[i % len(per)])
                        for i, s in enumerate(todo)
                    ]
                    reports = [f.result() for f in futures]
        finally:
            time.sleep(0.3)
            stop.set()
            drainer.join(timeout=5)
            events.close()
    return reports
