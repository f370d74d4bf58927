"""The executor seam: where fan-out work (task building, rollout workers) runs.

Callers see three things: ``submit(fn, *args, num_cpus=k)`` returning a
:class:`concurrent.futures.Future`, a progress channel (``events()`` on the driver, :func:`emit`
in the worker) and ``close()``. ``local`` runs spawned processes on this machine; ``ray`` runs Ray
tasks on a cluster. A third backend (e.g. Monarch actors) only has to provide the same three
things: futures for submitted calls, a queue the workers can put to, and a clean shutdown.

Functions given to ``submit`` must be importable module-level functions and their arguments
picklable, exactly as for :class:`concurrent.futures.ProcessPoolExecutor`.
"""

from __future__ import annotations

import queue as queue_mod
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from cadenza.errors import CadenzaError

EXECUTORS = ("local", "ray")


@dataclass(kw_only=True)
class ExecutorConfig:
    """Which backend runs fan-out work, and how to reach it."""

    kind: Literal["local", "ray"] = "local"
    """``local``: spawned processes on this machine. ``ray``: Ray tasks on a cluster."""
    ray_address: str = ""
    """Ray only. Empty: start a private local cluster for the run, pinned to 127.0.0.1;
    ``host:port`` (the GCS address printed by ``ray start --head``) or ``auto``: join that cluster."""
    workers: int = 1
    """Processes (local) or CPUs (ray, for a private cluster) to use."""
    max_retries: int = 2
    """Ray only: how often a unit whose worker process died is re-run elsewhere before it counts as lost."""
    run_dir: Path | None = None
    """Where a private Ray cluster keeps its session files (temp dir, logs); default: a temp dir."""
    connect_timeout_s: float = 60.0
    """Seconds to wait for a cluster to answer before failing with a one-line error."""

    def __post_init__(self) -> None:
        if self.kind not in EXECUTORS:
            raise CadenzaError(f"unknown executor {self.kind!r}; use one of {', '.join(EXECUTORS)}")
        if self.workers < 1:
            raise CadenzaError(f"--workers must be at least 1, got {self.workers}")
        if self.max_retries < 0:
            raise CadenzaError(f"executor max_retries must be >= 0, got {self.max_retries}")
        if self.ray_address and self.kind != "ray":
            raise CadenzaError("--ray-address needs --executor ray")


class Executor(Protocol):
    name: str

    def submit(self, fn: Callable[..., Any], *args: Any, num_cpus: int = 1) -> Future[Any]:
        """Run ``fn(*args)`` on a worker; the future holds its result or its exception."""

    def events(self) -> EventQueue:
        """The driver's end of the workers' progress channel."""

    def close(self) -> None:
        """Stop the workers (and a cluster this executor started); idempotent."""


class EventQueue(Protocol):
    def get(self, timeout: float) -> Any: ...
    def put(self, item: Any) -> None: ...


# --------------------------------------------------------------------------- worker side

_SINK: Any = None  # this worker process's end of the progress channel


def set_sink(sink: Any) -> None:
    global _SINK
    _SINK = sink


def emit(msg: Any) -> None:
    """Send a progress message to the driver (no-op outside an executor worker)."""
    if _SINK is not None:
        _SINK.put(msg)


def drain(q: EventQueue, timeout: float = 0.2) -> list[Any]:
    """Every message waiting in ``q`` (waits up to ``timeout`` for the first)."""
    out: list[Any] = []
    try:
        out.append(q.get(timeout=timeout))
        while True:
            out.append(q.get(timeout=0))
    except (queue_mod.Empty, EOFError, OSError):
        return out
    except Exception as exc:  # ray.util.queue.Empty is not a queue.Empty subclass
        if type(exc).__name__ == "Empty":
            return out
        raise
