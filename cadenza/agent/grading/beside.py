"""Grading's timing helpers: a run on its own thread beside the main one, and wall time per phase."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from cadenza.testrun import TestReport


class Beside:
    """A run on its own thread beside the main one; ``result(stop=True)`` kills it first (within one
    sandbox watch interval) when its outcome is no longer needed."""

    def __init__(self, start: Callable[[Callable[[], str | None]], tuple[TestReport, bool]]) -> None:
        self._stop = threading.Event()
        self._out: list[TestReport] = []
        self._error: list[BaseException] = []
        self.duration_s = 0.0  # its wall time, copy included (set when it ends)
        self._thread = threading.Thread(
            target=self._run, args=(start,), daemon=True, name="cadenza-grade-alone"
        )
        self._thread.start()

    def _run(self, start: Callable[[Callable[[], str | None]], tuple[TestReport, bool]]) -> None:
        t0 = time.monotonic()
        try:
            self._out.append(
                start(lambda: "not needed: the main run failed" if self._stop.is_set() else None)[0]
            )
        except BaseException as exc:  # re-raised in the grading thread
            self._error.append(exc)
        self.duration_s = round(time.monotonic() - t0, 3)

    def result(self, *, stop: bool) -> TestReport:
        if stop:
            self._stop.set()
        self._thread.join()  # bounded: the run has its own timeout and the sandbox kills at it
        if self._error:
            raise self._error[0]
        return self._out[0]


class Phases:
    """Wall time per grading phase, for the cost bench: each ``mark(name)`` closes the phase that began
    at the previous mark (``prep``: task, env and policy; ``copy``: copy, compare, apply; ``capability``;
    ``run_setup``: plugins, guard allowances; ``main_run``; ``join``: waiting for the alone run after the
    main one; ``cleanup``: removing the copies). ``alone_run`` (its copy included) overlaps the main run."""

    def __init__(self) -> None:
        self.start = self.last = time.monotonic()
        self.phases: dict[str, float] = {}

    def mark(self, name: str) -> None:
        now = time.monotonic()
        self.phases[name] = now - self.last
        self.last = now

    def total(self) -> float:
        return time.monotonic() - self.start

    def rounded(self) -> dict[str, float]:
        return {k: round(v, 3) for k, v in self.phases.items()}
