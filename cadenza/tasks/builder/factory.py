"""``cadenza tasks build``: many sources into one task set, in parallel, resumable.

The core pipeline (:func:`cadenza.tasks.builder.pipeline.iter_task_drafts`) yields validated drafts for
one source; this module turns each draft into a published task (copy, scrub, light environment,
leak scan, atomic publish) and runs sources in worker processes with a rich progress bar; spare
workers validate candidates of one source in parallel (:mod:`cadenza.tasks.builder.parallel`). A
source that fails is one row with a one-line reason in the build report; a draft with leak
findings is dropped, never published.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import queue as queue_mod
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cadenza.errors import CadenzaError
from cadenza.executor import ExecutorConfig, emit, make_executor, preflight, set_sink
from cadenza.tasks.builder.progress import BuildProgress
from cadenza.tasks.leaks.scan import Finding, scan_tasks
from cadenza.tasks.leaks.scrub import scrub_env, scrub_workspace
from cadenza.tasks.leaks.secret import derive_secret
from cadenza.tasks.records.owners import owner_alive, owner_tag
from cadenza.tasks.records.store import SourceReport, TaskStore
from cadenza.tasks.records.task import GOLD_PATCH, WORKSPACE, save_task

if TYPE_CHECKING:
    from cadenza.tasks.builder.pipeline import TaskDraft

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
    executor: str = "local"  # where sources are built: local processes or a Ray cluster (cadenza.executor)
    ray_address: str = ""  # with executor "ray": "" = a private loopback cluster, else host:port or "auto"

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
    executor: str = "local"
    retried: int = 0  # units re-run after their worker died (Ray)
    lost: int = 0  # units whose worker died on every try; their sources are reported failed
    startup_seconds: float = (
        0.0  # executor start-up before the first unit (a private Ray cluster, node checks)
    )


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
    from cadenza.tasks.sources.venv import make_task_env

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
    from cadenza.tasks.builder.pipeline import SourceConfig, prepare_source

    # No max_tasks here: drafts the scan rejects must not count, so the caller stops once the
    # set has enough tasks of this source.
    config = SourceConfig(levels=tuple(cfg.levels), seed=cfg.seed, llm_url=cfg.statement_llm)
    return prepare_source(
        spec, work_dir, levels=tuple(cfg.levels), seed=cfg.seed, config=config, stats=stats, skip=skip
    )


def _new_stats(spec: str) -> Any:
    from cadenza.tasks.builder.pipeline import BuildStats

    return BuildStats(source=spec)


def build_source(spec: str, cfg: BuildConfig, build_id: int | None = None, workers: int = 1) -> SourceReport:
    """Build the tasks of one source into the set; never raises for a bad source.

    The shared work runs once here; ``workers`` processes then validate candidates, and drafts
    are published in candidate order, so the set does not depend on ``workers``. Candidates whose
    task the set already holds (a resumed build) are skipped before any test runs.
    """
    from cadenza.tasks.builder.parallel import iter_attempts
    from cadenza.tasks.builder.pipeline import record_attempt

    t0 = time.monotonic()
    store = TaskStore(cfg.out)
    rep = SourceReport(source=spec, status="done")
    work = cfg.out / WORK / f"{hashlib.sha256(spec.encode()).hexdigest()[:12]}.{owner_tag()}"
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
    rep.prepare_seconds = round(stats.prepare_seconds, 2)
    rep.seconds = round(time.monotonic() - t0, 2)
    emit(("source", spec, asdict(rep)))
    return rep


def _worker(spec: str, cfg: BuildConfig, build_id: int, workers: int = 1) -> SourceReport:
    """One source, start to end, in whatever process the executor chose; records its report row."""
    rep = build_source(spec, cfg, build_id, workers)
    TaskStore(cfg.out).record_source(build_id, cfg.params_key(), rep)
    return rep


# --------------------------------------------------------------------------- many sources


def sweep_work(out: Path) -> None:
    """Remove work dirs of dead builds: they hold the original source, which must not outlive a build."""
    work = Path(out) / WORK
    if work.is_dir():
        for d in work.iterdir():
            if not owner_alive(d.name.rsplit(".", 1)[-1]):
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
    preflight(ExecutorConfig(kind=cfg.executor, ray_address=cfg.ray_address))  # before any work
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
    retried = lost = 0
    startup = 0.0
    if todo:
        retried, lost, startup = _run_parallel(todo, cfg, build_id, console)
    store.finish_build(build_id)
    return BuildSummary(
        executor=cfg.executor,
        retried=retried,
        lost=lost,
        startup_seconds=round(startup, 2),
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


def _run_parallel(todo: list[str], cfg: BuildConfig, build_id: int, console: Any) -> tuple[int, int, float]:
    """Every source in ``todo`` built through the configured executor; returns (retried, lost) units
    and the seconds the executor took to start before the first unit was submitted."""
    t0 = time.monotonic()
    per = split_workers(cfg.workers, len(todo))
    inline = cfg.executor == "local" and len(per) == 1
    ex = None
    if inline:
        events: Any = queue_mod.Queue()
        set_sink(events)
    else:
        workers = len(per) if cfg.executor == "local" else cfg.workers
        ex = make_executor(
            ExecutorConfig(
                kind=cfg.executor, ray_address=cfg.ray_address, workers=workers, run_dir=cfg.out / WORK
            )
        )
        events = ex.events()
    lost = 0
    try:
        if ex is not None and ex.name == "ray":
            _require_bwrap_on_nodes(ex)
        startup = time.monotonic() - t0
        with BuildProgress(todo, cfg.max_tasks, events, console=console, show=cfg.progress):
            if inline:
                for s in todo:
                    _worker(s, cfg, build_id, per[0])
                return 0, 0, startup
            assert ex is not None
            futures = {
                s: ex.submit(_worker, s, cfg, build_id, per[i % len(per)], num_cpus=per[i % len(per)])
                for i, s in enumerate(todo)
            }
            for spec, fut in futures.items():
                try:
                    fut.result()
                except Exception as exc:
                    if not _unit_lost(exc):
                        raise
                    lost += 1  # its worker died on every try: the source is reported, never half-published
                    reason = f"lost: its worker died ({type(exc).__name__}); rerun the build to resume it"
                    TaskStore(cfg.out).record_source(
                        build_id, cfg.params_key(), SourceReport(source=spec, status="failed", reason=reason)
                    )
        retried = ex.retries() if hasattr(ex, "retries") else 0
        return retried, lost, startup
    finally:
        if inline:
            set_sink(None)
        elif ex is not None:
            ex.close()


def _unit_lost(exc: BaseException) -> bool:
    from concurrent.futures.process import BrokenProcessPool

    if isinstance(exc, BrokenProcessPool):
        return False  # a local worker died: the pool is gone, nothing else can run
    from cadenza.executor.ray import is_lost

    return is_lost(exc)


def _require_bwrap_on_nodes(ex: Any) -> None:
    from cadenza.sandbox.runner import bwrap_path

    found = ex.run_on_every_node(bwrap_path)
    missing = [node[:12] for node, res in found.items() if isinstance(res, BaseException)]
    if missing:
        raise CadenzaError(
            f"{len(missing)} of {len(found)} Ray node(s) have no bubblewrap ({', '.join(missing)}); "
            "install it there (apt-get install bubblewrap) or remove those nodes"
        )
