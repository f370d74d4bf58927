"""``local`` executor: spawned worker processes on this machine (the default)."""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

from cadenza.executor.base import EventQueue, ExecutorConfig, set_sink


def exit_with_parent(parent: int) -> None:
    """Make this worker exit once ``parent`` is gone (``kill -9`` of a build) instead of idling forever."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _init(sink: Any, parent: int) -> None:
    set_sink(sink)
    exit_with_parent(parent)


class LocalExecutor:
    """A spawn-context process pool; the progress queue reaches workers through the initializer
    (a multiprocessing queue cannot travel as a call argument)."""

    name = "local"

    def __init__(self, cfg: ExecutorConfig) -> None:
        ctx = mp.get_context("spawn")
        self._events = ctx.Queue()
        self._pool = ProcessPoolExecutor(
            max_workers=cfg.workers, mp_context=ctx, initializer=_init, initargs=(self._events, os.getpid())
        )
        self._closed = False

    def submit(self, fn: Callable[..., Any], *args: Any, num_cpus: int = 1) -> Future[Any]:
        return self._pool.submit(fn, *args)

    def events(self) -> EventQueue:
        return self._events

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._events.close()
