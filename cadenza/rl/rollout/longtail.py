"""Long-tail control: a step draws more GRPO groups than it needs and ends once enough have finished.

An episode's length is not known in advance: one slow sandbox or one long generation holds the whole
step back while the engine idles. With ``rollout.oversample_groups = E`` a step draws
``tasks_per_step + E`` groups, and as soon as ``rollout.min_finished_groups`` of them (default
``tasks_per_step``) have every episode finished and graded, the step ends: the other groups are cut
whole (a GRPO group is never split, so every kept group's advantages are computed over all its
samples), their episodes are dropped, and the cut is counted (``groups_cut``, ``episodes_cut``).

The cut goes through the turn batcher (:meth:`~cadenza.rl.rollout.turn_batcher.TurnBatcher.abandon`):
every turn waiting for the engine, or asked for later, ends its episode at once; an episode inside a
tool call ends when the call returns, without being graded (its env is closed); nobody waits for it.
Which groups finish first depends on timing, so a run with the cut on is not bit-reproducible; with it
off (the default) nothing here runs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass(kw_only=True)
class CutCounts:
    """What one step's long-tail cut dropped (logged as step metrics)."""

    groups_cut: int = 0  # groups that had not finished when enough had
    episodes_cut: int = 0  # all episodes of those groups (finished or not), none trained on

    def as_row(self) -> dict[str, int]:
        return {"groups_cut": self.groups_cut, "episodes_cut": self.episodes_cut}


def step_groups(tasks_per_step: int, oversample_groups: int, min_finished_groups: int) -> tuple[int, int]:
    """``(groups drawn, groups that must finish)`` of one step; equal when the cut is off."""
    drawn = tasks_per_step + oversample_groups
    return drawn, (min_finished_groups or tasks_per_step)


class GroupRace(Generic[T]):
    """Runs one episode job per thread, ``group_size`` consecutive jobs per group, until ``need`` groups
    have finished; the jobs of the others ask :meth:`is_cut` and end early."""

    def __init__(self, groups: int, group_size: int, need: int) -> None:
        self.groups, self.size, self.need = groups, group_size, need
        self._lock = threading.Lock()
        self._enough = threading.Event()
        self._left = [group_size] * groups
        self._finished: list[int] = []
        self._cut = False
        self._error: BaseException | None = None

    def is_cut(self, group: int) -> bool:
        """Whether ``group`` was cut (its episode should stop now and not be graded)."""
        with self._lock:
            return self._cut and group not in self._finished

    def _one(self, job: Callable[[], T], k: int, results: list[Any]) -> None:
        g = k // self.size
        try:
            result = job()
        except BaseException as exc:  # the first failure of a live group ends the step with it
            with self._lock:
                if not self._cut:
                    self._cut, self._error = True, exc
                    self._enough.set()
            return
        with self._lock:
            if self._cut:
                return
            results[k] = result
            self._left[g] -= 1
            if self._left[g] == 0:
                self._finished.append(g)
                if len(self._finished) >= self.need:
                    self._cut = True
                    self._enough.set()

    def run(self, jobs: Sequence[Callable[[], T]], on_cut: Callable[[], None]) -> tuple[list[T], CutCounts]:
        """The results of the first ``need`` groups to finish (in group order) and what was cut;
        ``on_cut`` is called once the step has enough (it releases the cut episodes)."""
        assert len(jobs) == self.groups * self.size
        results: list[Any] = [None] * len(jobs)
        pool = ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="episode")
        for k, job in enumerate(jobs):
            pool.submit(self._one, job, k, results)
        pool.shutdown(wait=False)  # the cut episodes end on their own; nobody waits for them
        self._enough.wait()
        on_cut()
        if self._error is not None:
            raise self._error
        kept = sorted(self._finished)
        cut = self.groups - len(kept)
        out = [results[g * self.size + i] for g in kept for i in range(self.size)]
        return out, CutCounts(groups_cut=cut, episodes_cut=cut * self.size)
