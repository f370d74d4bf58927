"""Rollouts ahead of training: one worker thread runs the trainer's jobs in the order they were given.

The trainer submits "roll out step s" and "load weights of version v" jobs; one background thread
executes them first in, first out against the engine. Submitting step ``s + K + 1`` right after the
sync of version ``s`` makes the schedule deterministic: step ``s`` is always sampled by the weights of
version ``max(0, s - 1 - K)`` whatever the timings, while the rollouts of the next K steps overlap the
update of this one (``K = 0`` is the synchronous loop). Every engine call is watched: one that does
not return within ``timeout_s`` stops training with a one-line :class:`EngineError`, the engine is
closed (which releases a hung call) and the thread is joined; nothing is left running.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

import torch

from cadenza.errors import CadenzaError, ContextLengthExceeded, EngineError, is_context_overflow

_POLL_S = 0.05
_JOIN_S = 10.0

__all__ = ["EngineError", "RolloutPipeline", "WatchedEngine"]


class WatchedEngine:
    """An engine proxy that times every call (for the watchdog) and turns crashes into one line."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.name = str(getattr(engine, "name", type(engine).__name__))
        # (what, monotonic start) of each call in flight: the per-episode loop may have several batches
        # out at once (served engines), and the watchdog must see the oldest, not the last to start
        self._calls: dict[int, tuple[str, float]] = {}
        self._calls_lock = threading.Lock()
        self.stopped = False  # set when training stops: the rollout in progress ends at its next call
        # partial rollouts: a sync waits for the generation calls in flight and holds new ones back, so
        # weights never change under a batch (each batch, so each turn, has one policy version)
        self._gate = threading.Condition()
        self._sampling = 0
        self._syncing = False

    @property
    def version(self) -> int:
        return int(self.engine.version)

    @property
    def fixed_batches(self) -> bool:
        return bool(getattr(self.engine, "fixed_batches", False))

    def describe(self) -> str:
        log = getattr(self.engine, "log_path", None)
        return f"engine {self.name!r}" + (f" (log: {log})" if log else "")

    @contextmanager
    def _watch(self, what: str):  # type: ignore[no-untyped-def]
        if self.stopped:
            raise EngineError(f"{self.describe()}: training stopped")
        key = object()
        with self._calls_lock:
            self._calls[id(key)] = (what, time.monotonic())
        try:
            yield
        except ContextLengthExceeded:
            raise  # the conversation outgrew the window: the rollout ends that episode as "context"
        except Exception as exc:
            first = (str(exc).splitlines() or [""])[0]
            # e.g. an HTTP 400 "maximum context length" that the engine passed on as it came
            if what == "generation" and is_context_overflow(str(exc)):
                raise ContextLengthExceeded(f"{self.describe()}: {first}") from None
            if isinstance(exc, CadenzaError):
                raise  # the engine's own one-line error
            raise EngineError(
                f"{self.describe()} failed during {what}: {type(exc).__name__}: {first}"
            ) from None
        finally:
            with self._calls_lock:
                self._calls.pop(id(key), None)

    def sample(self, request: Any) -> list[Any]:
        with self._gate:
            while self._syncing:
                self._gate.wait()
            self._sampling += 1
        try:
            with self._watch("generation"):
                return self.engine.sample(request)
        finally:
            with self._gate:
                self._sampling -= 1
                self._gate.notify_all()

    def sync_between_batches(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], *, version: int, timeout_s: float
    ) -> None:
        """Sync now, from the calling thread, between two generation batches of the rollout in progress
        (whose episodes then go on with the new weights): the partial-rollout sync."""
        deadline = time.monotonic() + timeout_s
        with self._gate:
            self._syncing = True
            try:
                while self._sampling:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise EngineError(
                            f"{self.describe()}: a generation batch did not finish within {timeout_s:g} s "
                            f"of the weight sync to version {version} (rollout.engine_timeout_s)"
                        )
                    self._gate.wait(min(left, 1.0))
                self.sync_weights(named_tensors, version=version)
            finally:
                self._syncing = False
                self._gate.notify_all()

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], *, version: int) -> None:
        with self._watch(f"weight sync to version {version}"):
            self.engine.sync_weights(named_tensors, version=version)

    def overdue(self, timeout_s: float) -> str | None:
        """What the engine has been busy with for longer than ``timeout_s``, if anything."""
        busy = self.busy
        if busy is not None and time.monotonic() - busy[1] > timeout_s:
            return busy[0]
        return None

    @property
    def busy(self) -> tuple[str, float] | None:
        """The oldest call in flight, as ``(what, monotonic start)``; ``None`` when idle."""
        with self._calls_lock:
            return min(self._calls.values(), key=lambda c: c[1], default=None)


class RolloutPipeline:
    """FIFO jobs on one daemon thread; results are taken per step by the trainer, with a watchdog."""

    def __init__(self, engine: WatchedEngine, *, timeout_s: float, threads: int = 0) -> None:
        self.engine = engine
        self.timeout_s = timeout_s
        self._threads = threads or torch.get_num_threads()
        self._jobs: queue.Queue[tuple[Future, Callable[[], Any]] | None] = queue.Queue()
        self._results: dict[int, Future] = {}
        self._closed = False
        self.thread = threading.Thread(target=self._work, name="cadenza-rollouts", daemon=True)
        self.thread.start()

    def _work(self) -> None:
        torch.set_num_threads(self._threads)  # same intra-op threads as the trainer: same numerics
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fut, fn = job
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as exc:  # handed to the trainer thread, which re-raises it
                fut.set_exception(exc)

    def _submit(self, fn: Callable[[], Any]) -> Future:
        if self._closed:
            raise CadenzaError("the rollout pipeline is closed")
        fut: Future = Future()
        self._jobs.put((fut, fn))
        return fut

    def submit(self, step: int, fn: Callable[[], Any]) -> None:
        """Queue step ``step``'s rollouts (``fn`` runs on the worker thread)."""
        self._results[step] = self._submit(fn)

    def put(self, step: int, value: Any = None, *, error: BaseException | None = None) -> None:
        """A step whose result is already known (restored from a checkpoint, or failed to start)."""
        fut: Future = Future()
        fut.set_running_or_notify_cancel()
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(value)
        self._results[step] = fut

    def take(self, step: int) -> Any:
        """Step ``step``'s rollouts (waits; raises the job's exception or an :class:`EngineError`)."""
        fut = self._results.pop(step, None)
        if fut is None:
            raise CadenzaError(f"no rollouts were queued for step {step}")
        return self._wait(fut)

    def ready(self) -> dict[int, Any]:
        """Results of the queued steps that already finished without error (for checkpoints)."""
        return {s: f.result() for s, f in sorted(self._results.items()) if f.done() and f.exception() is None}

    def sync(
        self,
        weights: Callable[[], Iterable[tuple[str, torch.Tensor]]],
        version: int,
        *,
        partial: bool = False,
        here: bool = False,
    ) -> float:
        """Load ``weights()`` into the engine after the jobs queued so far; wait; return the seconds taken.

        ``partial``: now instead, between two batches of the rollout in progress (its episodes go on with
        the new weights; each turn records the version that sampled it). The trainer does not touch its
        parameters until this returns, so the stream reads settled weights either way.
        ``here``: the stream is read on the calling thread (it is a collective of a sharded trainer, which
        every rank runs on its trainer thread), while the worker thread is held at this point of its queue.
        """
        t0 = time.perf_counter()
        if partial:
            self.engine.sync_between_batches(weights(), version=version, timeout_s=self.timeout_s)
        elif here:
            self._sync_here(weights, version)
        else:
            self._wait(self._submit(lambda: self.engine.sync_weights(weights(), version=version)))
        return time.perf_counter() - t0

    def _sync_here(self, weights: Callable[[], Iterable[tuple[str, torch.Tensor]]], version: int) -> None:
        """Hold the worker thread once the jobs queued so far are done; sync from this thread; release."""
        reached, release = threading.Event(), threading.Event()

        def hold() -> None:
            reached.set()
            if not release.wait(self.timeout_s * 4):
                raise EngineError(f"{self.engine.describe()}: the sync to version {version} never ended")

        held = self._submit(hold)
        try:
            while not reached.wait(_POLL_S):
                if held.done():  # cancelled, or the thread is gone: _wait raises the reason
                    break
                what = self.engine.overdue(self.timeout_s)
                if what is not None:
                    raise EngineError(
                        f"{self.engine.describe()} did not finish a {what} within {self.timeout_s:g} s "
                        "(rollout.engine_timeout_s); training stopped"
                    )
                if not self.thread.is_alive():
                    raise EngineError(f"the rollout thread of {self.engine.describe()} died")
            if held.done():
                self._wait(held)
            self.engine.sync_weights(weights(), version=version)
        finally:
            release.set()
        self._wait(held)

    def _wait(self, fut: Future) -> Any:
        while True:
            try:
                return fut.result(timeout=_POLL_S)
            except TimeoutError:
                pass
            what = self.engine.overdue(self.timeout_s)
            if what is not None:
                raise EngineError(
                    f"{self.engine.describe()} did not finish a {what} within {self.timeout_s:g} s "
                    "(rollout.engine_timeout_s); training stopped"
                )
            if not self.thread.is_alive() and not fut.done():
                raise EngineError(f"the rollout thread of {self.engine.describe()} died")

    def close(self) -> None:
        """Cancel queued jobs, close the engine (unblocking a hung call), join the worker thread."""
        if self._closed:
            return
        self._closed = True
        for fut in self._results.values():
            fut.cancel()
        while True:  # drop what was never started
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job[0].cancel()
        self._jobs.put(None)
        self.engine.stopped = True
        if self.thread.is_alive() and self.engine.busy is not None:
            self.engine.engine.close()
        self.thread.join(_JOIN_S)
        self._results.clear()
