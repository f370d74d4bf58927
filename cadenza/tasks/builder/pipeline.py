"""One source -> validated task drafts: fetch, environment, baseline + coverage, delete, validate, state.

:func:`iter_task_drafts` is sequential and yields :class:`TaskDraft` objects as they validate; the
caller (the store) scrubs, leak-scans and writes each task directory. It is two halves that also
run apart: :func:`prepare_source` (the shared work, once) and :func:`attempt_candidate` (one
candidate, self-contained so worker processes can run it, see :mod:`cadenza.tasks.builder.parallel`). Work
amortised per source: two full runs (baseline + coverage, see :mod:`cadenza.tasks.deletion.baseline`); per
validated task about one full run (plus partial runs of covering tests and of F2P on the gold copy).
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from cadenza.errors import SourceError
from cadenza.tasks.builder.ordering import LEVEL_KINDS, candidate_key, order_candidates, task_id
from cadenza.tasks.deletion.baseline import run_baseline
from cadenza.tasks.deletion.delete import Deletion, DeletionError, plan_deletion, site_lines
from cadenza.tasks.deletion.features import Candidate, module_files
from cadenza.tasks.deletion.statement import write_statement
from cadenza.tasks.records.task import Task
from cadenza.tasks.sources.fetch import fetch_source
from cadenza.tasks.sources.runner import RunCounter, pytest_args_for
from cadenza.tasks.sources.source import SourceInfo, copy_tree
from cadenza.tasks.sources.venv import BaseEnv, ensure_base_env, make_task_env
from cadenza.tasks.validation.validate import (
    ValidationContext,
    ValidationSettings,
    importable_modules,
    prepare_workspace,
    validate,
)


@dataclass(kw_only=True)
class SourceConfig(ValidationSettings):
    """Knobs for one source, the validation settings among them. ``max_candidates`` caps attempts (None:
    until ``max_tasks`` or exhausted)."""

    levels: tuple[int, ...] = (1, 2, 3)
    max_tasks: int | None = None
    max_candidates: int | None = None
    seed: int = 0
    env_cache_dir: Path | None = None
    llm_url: str | None = None
    llm_model: str = "default"


@dataclass(kw_only=True)
class BuildStats:
    """What happened to one source (filled in place while drafts are yielded)."""

    source: str
    candidates: int = 0
    tried: int = 0
    validated: int = 0
    by_level: Counter = field(default_factory=Counter)
    rejected: Counter = field(default_factory=Counter)
    rejections: list[tuple[str, int, str]] = field(default_factory=list)
    skipped: int = 0  # candidates whose task the set already holds (never attempted)
    suite_size: int = 0
    excluded_tests: list[str] = field(default_factory=list)
    counter: RunCounter = field(default_factory=RunCounter)
    seconds: float = 0.0
    env_seconds: float = 0.0
    prepare_seconds: float = 0.0  # prepare_source: fetch, base env, baseline + coverage map

    @property
    def full_suite_runs(self) -> float:
        """Full-suite-equivalent pytest runs spent on this source so far."""
        return self.counter.equivalents(self.suite_size)

    def to_dict(self) -> dict:
        return {
            "source": self.source,
            "candidates": self.candidates,
            "skipped": self.skipped,
            "tried": self.tried,
            "validated": self.validated,
            "by_level": dict(self.by_level),
            "rejected": dict(self.rejected),
            "suite_size": self.suite_size,
            "excluded_tests": len(self.excluded_tests),
            "full_suite_runs": round(self.full_suite_runs, 3),
            "seconds": round(self.seconds, 2),
            "env_seconds": round(self.env_seconds, 2),
            "prepare_seconds": round(self.prepare_seconds, 2),
        }


@dataclass(kw_only=True)
class TaskDraft:
    """A validated task before scrubbing: the record, the post-deletion workspace, the gold patch.

    ``removed_snippets`` are strings a leak scan must not find anywhere reachable from the task;
    ``base_env`` is what :func:`cadenza.tasks.sources.venv.make_task_env` needs to give the task its env.
    """

    task: Task
    workspace: Path
    gold_patch: str
    removed_snippets: list[str]
    base_env: BaseEnv
    source: SourceInfo
    deletion: Deletion


@dataclass(kw_only=True)
class SourcePlan:
    """The shared, expensive per-source work, done once and handed to every candidate worker.

    Picklable, so a process pool gets it once per worker (pool initializer), never per candidate.
    ``ordered`` is the candidate order after skipping what the set already holds.
    """

    spec: str
    source: SourceInfo
    ctx: ValidationContext
    modules: dict[str, str]
    known_lines: frozenset[str]
    ordered: list[tuple[int, Candidate]]
    config: SourceConfig


@dataclass(kw_only=True)
class Attempt:
    """One candidate's outcome: a draft, or why not (``tried``: whether tests ran for it)."""

    index: int
    level: int
    qualname: str
    draft: TaskDraft | None = None
    reason: str = ""
    tried: bool = False
    counter: RunCounter = field(default_factory=RunCounter)


def prepare_source(
    spec: str,
    work_dir: Path,
    *,
    levels: tuple[int, ...],
    seed: int,
    config: SourceConfig,
    stats: BuildStats,
    skip: Collection[tuple[str, int]] = (),
) -> SourcePlan:
    """Fetch, base env, baseline + coverage map, candidate order; ``skip`` keys are dropped here."""
    bad = [lv for lv in levels if lv not in LEVEL_KINDS]
    if bad:
        raise SourceError(f"unknown level(s) {bad}; levels are 1, 2 and 3")
    cfg = config
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    t_prepare = time.monotonic()
    source = fetch_source(spec, work_dir / "source")
    t_env = time.monotonic()
    base = ensure_base_env(source, cfg.env_cache_dir)
    stats.env_seconds = time.monotonic() - t_env
    baseline_ws = work_dir / "baseline"
    copy_tree(source.root, baseline_ws)
    python = make_task_env(base, baseline_ws, work_dir / "baseline-env")
    pytest_args = pytest_args_for(baseline_ws, python)
    baseline, fmap = run_baseline(
        source,
        python,
        baseline_ws,
        pytest_args=pytest_args,
        timeout_s=cfg.timeout_s,
        per_test_timeout_s=cfg.per_test_timeout_s,
        counter=stats.counter,
    )
    stats.suite_size = baseline.suite_size
    stats.excluded_tests = list(baseline.excluded)
    modules = module_files(source)
    importable = importable_modules(
        python, baseline_ws, sorted({m for m in modules.values() if m.split(".")[-1] != "__main__"})
    )
    shutil.rmtree(baseline_ws, ignore_errors=True)
    ctx = ValidationContext(
        base_env=base,
        pristine=source.root,
        baseline=baseline,
        pytest_args=pytest_args,
        importable=importable,
        test_paths=source.test_paths,
        settings=cfg,
    )
    ordered = order_candidates(fmap, baseline, levels, seed, frozenset(source.packages))
    stats.candidates = len(ordered)
    stats.prepare_seconds = time.monotonic() - t_prepare
    skip_keys = {candidate_key(q, lv) for q, lv in skip}
    kept = [(lv, c) for lv, c in ordered if candidate_key(c.qualname, lv) not in skip_keys]
    stats.skipped = len(ordered) - len(kept)
    return SourcePlan(
        spec=spec,
        source=source,
        ctx=ctx,
        modules=modules,
        known_lines=site_lines(base.site_packages),
        ordered=kept,
        config=cfg,
    )


def attempt_candidate(plan: SourcePlan, index: int, cand_dir: Path) -> Attempt:
    """Delete, validate and (if it holds) draft candidate ``plan.ordered[index]`` in ``cand_dir``.

    Self-contained so a worker process can run it: its pytest runs are counted in ``Attempt.counter``.
    A rejected candidate leaves nothing behind; a draft's workspace is ``cand_dir/workspace``.
    """
    level, cand = plan.ordered[index]
    out = Attempt(index=index, level=level, qualname=cand.qualname)
    source, cfg = plan.source, plan.config
    try:
        deletion = plan_deletion(source.root, cand, level, plan.modules, known_lines=plan.known_lines)
    except DeletionError as exc:
        out.reason = f"not deletable: {exc}"
        return out
    except (UnicodeDecodeError, RecursionError, OSError) as exc:
        out.reason = f"unreadable: {type(exc).__name__}"
        return out
    except Exception as exc:  # a libcst corner case must cost one candidate, not the whole source
        out.reason = f"deletion failed: {type(exc).__name__}: {exc}"[:300]
        return out
    if not deletion.removed_snippets:
        # Nothing distinctive was removed (e.g. ``return self``): trivial, and no leak scan could check it.
        out.reason = "not deletable: nothing distinctive removed"
        return out
    out.tried = True
    ctx = replace(plan.ctx, counter=out.counter)
    prepare_workspace(ctx, deletion, cand_dir / "run")
    result = validate(ctx, deletion, cand_dir / "run", cand_dir / "scratch")
    for sub in ("run", "scratch"):
        shutil.rmtree(cand_dir / sub, ignore_errors=True)
    if not result.ok:
        out.reason = result.reason
        shutil.rmtree(cand_dir, ignore_errors=True)
        return out
    # The draft's workspace is rebuilt from the pristine copy: nothing the test runs wrote survives.
    workspace = cand_dir / "workspace"
    prepare_workspace(ctx, deletion, workspace)
    statement = write_statement(deletion, result.fail_to_pass, llm_url=cfg.llm_url, llm_model=cfg.llm_model)
    baseline = ctx.baseline
    task = Task(
        id=task_id(source, cand.qualname, level),
        source=plan.spec,
        feature=cand.feature(),
        level=level,
        statement=statement,
        fail_to_pass=result.fail_to_pass,
        pass_to_pass=result.pass_to_pass,
        package=source.packages[0],
        test_files=list(source.test_paths),
        pytest_args=list(ctx.pytest_args),
        test_timeout_s=float(cfg.per_test_timeout_s or 60.0),
        excluded_tests=list(baseline.excluded),
        meta={
            "source_name": source.name,
            "source_version": source.version,
            "content_hash": source.content_hash,
            "layout": source.layout,
            "import_root": source.import_root,
            "packages": source.packages,
            "changed_files": sorted(deletion.changed),
            "deleted_files": sorted(p for p, t in deletion.changed.items() if t is None),
            "removed_names": deletion.removed_names,
            "signature": deletion.signature,
            "gold_check": cfg.gold_check,
        },
    )
    out.draft = TaskDraft(
        task=task,
        workspace=workspace,
        gold_patch=deletion.gold_patch,
        removed_snippets=deletion.removed_snippets,
        base_env=ctx.base_env,
        source=source,
        deletion=deletion,
    )
    return out


def record_attempt(stats: BuildStats, att: Attempt) -> None:
    """Fold one attempt into the source's stats (the caller decides what a draft becomes)."""
    stats.counter.full_runs += att.counter.full_runs
    stats.counter.subset_runs += att.counter.subset_runs
    stats.counter.subset_tests += att.counter.subset_tests
    stats.counter.seconds += att.counter.seconds
    stats.tried += att.tried
    if att.draft is not None:
        stats.validated += 1
        stats.by_level[att.level] += 1
    else:
        stats.rejected[att.reason.split(":")[0]] += 1
        stats.rejections.append((att.qualname, att.level, att.reason))


def iter_task_drafts(
    spec: str,
    work_dir: Path,
    *,
    levels: tuple[int, ...] = (1, 2, 3),
    max_tasks: int | None = None,
    seed: int = 0,
    config: SourceConfig | None = None,
    stats: BuildStats | None = None,
    skip: Collection[tuple[str, int]] = (),
) -> Iterator[TaskDraft]:
    """Yield validated drafts for ONE source, sequentially; ``stats`` (if given) is updated in place.

    ``work_dir`` must be empty or absent; it receives ``source/`` (the pristine copy), the
    baseline env and one ``cand-NNNN/`` per attempt (rejected ones are removed; a yielded draft's
    ``workspace`` stays until the caller moves or deletes it). ``skip``: ``(qualname, level)`` keys
    never attempted (a resumed build passes what its set already holds). Raises
    :class:`SourceError` when the source cannot be used (fetch, environment, no passing tests).
    For candidates in parallel see :func:`cadenza.tasks.builder.parallel.iter_attempts`.
    """
    cfg = config or SourceConfig()
    levels = tuple(levels or cfg.levels)
    max_tasks = max_tasks if max_tasks is not None else cfg.max_tasks
    stats = stats if stats is not None else BuildStats(source=spec)
    start = time.monotonic()
    plan = prepare_source(spec, Path(work_dir), levels=levels, seed=seed, config=cfg, stats=stats, skip=skip)
    stats.seconds = time.monotonic() - start
    for index in range(len(plan.ordered)):
        if max_tasks is not None and stats.validated >= max_tasks:
            break
        if cfg.max_candidates is not None and stats.tried >= cfg.max_candidates:
            break
        att = attempt_candidate(plan, index, Path(work_dir) / f"cand-{index:04d}")
        record_attempt(stats, att)
        stats.seconds = time.monotonic() - start
        if att.draft is not None:
            yield att.draft
            stats.seconds = time.monotonic() - start
    stats.seconds = time.monotonic() - start
