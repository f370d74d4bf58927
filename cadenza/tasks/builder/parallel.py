"""Candidates of one source validated by N worker processes, results handed back in candidate order.

The shared work (:func:`cadenza.tasks.builder.pipeline.prepare_source`: fetch, base env, baseline,
coverage map) runs once in the caller; the resulting :class:`SourcePlan` goes to each worker once
(the pool initializer), and each job is just a candidate index. Results come back in the order a
single process would produce them, so a build that stops at ``--max-tasks`` publishes the same
tasks whatever the worker count; the price is at most ``2 * workers`` speculative attempts (fewer
near ``--max-tasks``) that the caller may discard when it stops.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

from cadenza.executor.local import exit_with_parent
from cadenza.tasks.builder.pipeline import Attempt, SourcePlan, attempt_candidate

_PLAN: SourcePlan | None = None


def _init(plan: SourcePlan, parent: int) -> None:
    global _PLAN
    _PLAN = plan
    exit_with_parent(parent)


def _attempt(index: int, cand_dir: Path) -> Attempt:
    assert _PLAN is not None, "worker started without a plan"
    return attempt_candidate(_PLAN, index, cand_dir)


def cand_dir(work_dir: Path, index: int) -> Path:
    return Path(work_dir) / f"cand-{index:04d}"


def iter_attempts(
    plan: SourcePlan, work_dir: Path, workers: int = 1, need: Callable[[], int | None] | None = None
) -> Iterator[Attempt]:
    """Every candidate of ``plan`` attempted, yielded in order; close the generator to stop early.

    ``workers == 1`` runs in this process (no pool). ``need()``: how many more drafts the caller
    still wants (None: no limit); no more attempts than that are in flight, so a build that is
    about to finish does not start work it will throw away. On close, queued attempts are
    cancelled and running ones finish (a pytest run is never killed half way); their directories
    stay under ``work_dir`` for the caller to remove.
    """
    n = len(plan.ordered)
    if workers <= 1:
        for index in range(n):
            yield attempt_candidate(plan, index, cand_dir(work_dir, index))
        return
    window = 2 * workers  # keeps every worker busy while the head of the line is still running
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=mp.get_context("spawn"),
        initializer=_init,
        initargs=(plan, os.getpid()),
    )
    pending: dict[int, Future[Attempt]] = {}
    try:
        submitted = 0
        for index in range(n):
            want = need() if need is not None else None
            limit = window if want is None else max(1, min(window, want))
            while submitted < n and submitted < index + limit:
                pending[submitted] = pool.submit(_attempt, submitted, cand_dir(work_dir, submitted))
                submitted += 1
            yield pending.pop(index).result()
    finally:
        for fut in pending.values():
            fut.cancel()
        pool.shutdown(wait=True, cancel_futures=True)
