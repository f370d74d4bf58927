"""Where fan-out work runs: ``local`` processes (default) or a ``ray`` cluster. See :mod:`.base`."""

from cadenza.executor.base import (
    EXECUTORS,
    EventQueue,
    Executor,
    ExecutorConfig,
    drain,
    emit,
    set_sink,
)
from cadenza.executor.make import make_executor, preflight

__all__ = [
    "EXECUTORS",
    "EventQueue",
    "Executor",
    "ExecutorConfig",
    "drain",
    "emit",
    "make_executor",
    "preflight",
    "set_sink",
]
