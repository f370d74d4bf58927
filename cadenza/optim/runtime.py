"""Drive communication jobs with up to N transfers in flight.

A job is a generator that issues an ``async_op=True`` collective and yields its work handle; when
resumed, the transfer is done and it computes (Newton–Schulz) and may yield the next transfer. The
runtime always resumes the oldest pending job (FIFO), so every rank issues collectives in the same
order regardless of timing, while younger jobs' transfers proceed under the older job's compute.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Generator, Iterable
from dataclasses import dataclass
from typing import Any

Job = Generator[Any, None, None]


@dataclass(kw_only=True)
class RuntimeStats:
    """``exposed_wait_s``: time blocked on transfers (transfer time *not* hidden behind compute)."""

    jobs: int = 0
    transfers: int = 0
    exposed_wait_s: float = 0.0
    total_s: float = 0.0


def _advance(job: Job) -> Any | None:
    try:
        return next(job)
    except StopIteration:
        return None


def run_jobs(jobs: Iterable[Job], max_in_flight: int = 4) -> RuntimeStats:
    """Run every job to completion, keeping at most ``max_in_flight`` transfers outstanding."""
    if max_in_flight < 1:
        raise ValueError("max_in_flight must be >= 1")
    stats = RuntimeStats()
    start = time.perf_counter()
    pending: deque[tuple[Job, Any]] = deque()

    def settle_oldest() -> None:
        job, work = pending.popleft()
        t0 = time.perf_counter()
        work.wait()
        stats.exposed_wait_s += time.perf_counter() - t0
        nxt = _advance(job)
        if nxt is not None:
            stats.transfers += 1
            pending.append((job, nxt))

    for job in jobs:
        stats.jobs += 1
        work = _advance(job)
        if work is not None:
            stats.transfers += 1
            pending.append((job, work))
        while len(pending) >= max_in_flight:
            settle_oldest()
    while pending:
        settle_oldest()
    stats.total_s = time.perf_counter() - start
    return stats
