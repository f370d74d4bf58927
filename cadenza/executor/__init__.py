"""Where fan-out work runs: ``local`` processes (default) or a ``ray`` cluster. See :mod:`.base`."""

from cadenza.executor.base import (
    EXECUTORS,
    EventQueue,
    Executor,
    ExecutorConfig,
    drain,
    emit,
    make_executor,
    preflight,
    set_sink,
)

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
