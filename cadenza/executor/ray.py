"""``ray`` executor: units of work as Ray tasks on a cluster (or a private loopback cluster).

A private cluster (no ``ray_address``) is pinned to 127.0.0.1, keeps its session files under the
run directory and gets its auth token through the environment, so nothing is written to ``~/.ray``
and no listener leaves loopback. It never outlives the driver: a supervisor
(:mod:`cadenza.executor.reaper`) stops every process of it when the driver dies, even by ``SIGKILL``,
and ``SIGTERM`` on the driver is a clean shutdown (``SystemExit``, so ``close()`` runs).

Ray lowers every worker process to niceness 15 (``RAY_worker_niceness``) so that its own daemons stay
responsive; cadenza's workers do the run's real work (rollouts, engines, grading), and beside a trainer or
any other busy process at niceness 0 a worker at 15 gets 1/28 of its share of a core: on a loaded 2-core
machine four actors did not finish importing torch in 400 s (33 s at 0). Both a private cluster and a
joined one therefore run this job's workers at the driver's own niceness (:data:`WORKER_ENV`).

A unit whose worker process or node dies is re-run by Ray up to ``max_retries`` times; every start
is reported to the driver, so retries and losses are counted rather than guessed.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from cadenza.errors import CadenzaError
from cadenza.executor import reaper
from cadenza.executor.base import EventQueue, ExecutorConfig, emit, set_sink

INSTALL_HINT = "pip install 'cadenza[ray]' (ray==2.60.0)"
_START = "__cadenza_unit_start__"
LOST_ERRORS = ("WorkerCrashedError", "NodeDiedError", "ActorDiedError", "OwnerDiedError", "ObjectLostError")


_MAX_CLUSTER_DIR = 38  # bytes of a private cluster's directory path (see cluster_dir)
PRIVATE_STARTS = 2  # tries to start the private cluster when the node misses Ray's start-up window
_SLOW_START = "timed out during startup"  # Ray's words for that (ray._private.node)
WORKER_ENV = {"RAY_worker_niceness": "0"}  # Ray's default 15 starves workers beside busy processes
log = logging.getLogger(__name__)
_TOKEN: list[str] = []


def _process_token() -> str:
    """One auth token per process: Ray caches the token it read first, so a second private cluster in
    the same process must use the same one."""
    if not _TOKEN:
        _TOKEN.append(secrets.token_hex(16))
    return _TOKEN[0]


def cluster_dir(run_dir: str | None) -> Path:
    """A new directory for one private cluster (the supervisor reaps exactly the processes using it).

    Ray puts its unix sockets under it (``<dir>/session_<date>_<time>_<us>_<pid>/sockets/plasma_store``,
    up to ~65 bytes more) and AF_UNIX allows 107, so the directory may take at most 38: under the run's
    own directory when that is short enough, else in the system temp directory (``/tmp`` when even that
    is too long)."""
    base = Path(run_dir).resolve() / "ray" if run_dir else None
    if base is not None and len(str(base)) + 9 <= _MAX_CLUSTER_DIR:  # + "/" + 8 random characters
        base.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix="", dir=base))
    temp = tempfile.gettempdir()
    short = temp if len(temp) + len("/cadenza-ray-") + 8 <= _MAX_CLUSTER_DIR else "/tmp"
    return Path(tempfile.mkdtemp(prefix="cadenza-ray-", dir=short))


def _call(sink: Any, unit: int, fn: Callable[..., Any], *args: Any) -> Any:
    """Runs on the worker: connect the progress channel, announce the start, run the unit."""
    set_sink(sink)
    emit((_START, unit, os.getpid()))
    return fn(*args)


def _on_sigterm(signum: int, frame: object) -> None:
    """``SIGTERM`` on the driver: unwind like Ctrl-C, so every ``finally`` (``close()``) runs."""
    raise SystemExit(128 + signum)


def _probe(fn: Callable[[], Any]) -> tuple[str, Any]:
    import ray

    try:
        return ray.get_runtime_context().get_node_id(), fn()
    except Exception as exc:
        return ray.get_runtime_context().get_node_id(), exc


def _check_answers(address: str, timeout_s: float) -> None:
    """Fail in seconds, not minutes, when ``host:port`` has nobody listening."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise CadenzaError(f"--ray-address {address!r} is not host:port (or 'auto'); e.g. 127.0.0.1:6379")
    try:
        with socket.create_connection(
            (host.strip("[]") or "127.0.0.1", int(port)), timeout=min(timeout_s, 5)
        ):
            pass
    except OSError as exc:
        raise CadenzaError(
            f"Ray address {address} does not answer ({exc.strerror or exc}); start a cluster with "
            "`ray start --head` there, or drop --ray-address to use a private local cluster"
        ) from None


def preflight(cfg: ExecutorConfig) -> None:
    """The checks that need no cluster: Ray importable, the address answering. Run before any work."""
    import importlib.util

    try:
        found = importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):  # ValueError: the module is blocked in sys.modules
        found = False
    if not found:
        raise CadenzaError(f"--executor ray needs Ray, which is not installed; {INSTALL_HINT}")
    if cfg.ray_address and cfg.ray_address != "auto":
        _check_answers(cfg.ray_address, cfg.connect_timeout_s)


class _Events:
    """The driver's end: hides the unit-start messages and counts them."""

    def __init__(self, q: Any, owner: RayExecutor) -> None:
        self._q, self._owner = q, owner

    def get(self, timeout: float) -> Any:
        while True:
            msg = self._q.get(timeout=timeout)
            if isinstance(msg, tuple) and msg and msg[0] == _START:
                self._owner.starts[msg[1]] = self._owner.starts.get(msg[1], 0) + 1
                continue
            return msg

    def put(self, item: Any) -> None:
        self._q.put(item)


class RayExecutor:
    name = "ray"

    def __init__(self, cfg: ExecutorConfig) -> None:
        self._saved_env: dict[str, str | None] = {}
        if not cfg.ray_address:
            self._private_env()  # before Ray is imported: it reads its auth mode once, at import
        try:
            import ray
        except ImportError:
            raise CadenzaError(f"--executor ray needs Ray, which is not installed; {INSTALL_HINT}") from None
        self.cfg = cfg
        self.starts: dict[int, int] = {}
        self._units = itertools.count()
        self._started = False
        self._tmp: Path | None = None
        self._reaper: subprocess.Popen[bytes] | None = None
        self._old_sigterm: Any = None
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no telemetry leaves the machine
        if ray.is_initialized():
            raise CadenzaError("Ray is already initialised in this process; run one cadenza job per process")
        if cfg.ray_address:
            if cfg.ray_address != "auto":
                _check_answers(cfg.ray_address, cfg.connect_timeout_s)
            try:
                ray.init(
                    address=cfg.ray_address,
                    runtime_env={"env_vars": WORKER_ENV},  # this job's workers only, not the cluster's
                    log_to_driver=False,
                    configure_logging=False,
                )
            except Exception as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise CadenzaError(
                    f"cannot join the Ray cluster at {cfg.ray_address} ({first}); check `ray status` there"
                ) from None
        else:
            self._start_private(ray)
        self._queue: Any = None  # the progress channel's actor: started on first use (see _channel)
        self._events: _Events | None = None

    def _private_env(self) -> None:
        env = {
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "RAY_AUTH_MODE": "token",  # a token in the environment: nothing is written to ~/.ray
            "RAY_AUTH_TOKEN": _process_token(),
            **WORKER_ENV,  # the raylet inherits it, and every worker from the raylet
        }
        self._saved_env = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        if "ray" in sys.modules:  # imported earlier in this process: make it re-read its auth mode
            with contextlib.suppress(Exception):
                from ray._private.authentication.authentication_token_setup import _enable_token_auth

                _enable_token_auth()

    def _start_private(self, ray: Any) -> None:
        """Start this run's own cluster; a node that misses Ray's fixed 30 s registration window (raylet to
        GCS, hard-coded in ``ray._private.node``; seen on 2 cores at load 14) is reaped and started again
        in a fresh directory, up to :data:`PRIVATE_STARTS` times, before the one-line error."""
        for attempt in range(1, PRIVATE_STARTS + 1):
            tmp = cluster_dir(self.cfg.run_dir)
            self._tmp = tmp
            self._reaper = reaper.spawn(os.getpid(), tmp)  # before the first Ray process exists
            if threading.current_thread() is threading.main_thread():
                self._old_sigterm = signal.signal(signal.SIGTERM, _on_sigterm) or signal.SIG_DFL
            try:
                ray.init(
                    num_cpus=self.cfg.workers,
                    include_dashboard=False,
                    _node_ip_address="127.0.0.1",
                    _temp_dir=str(tmp),
                    log_to_driver=False,
                    configure_logging=False,
                )
                break
            except Exception as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                with contextlib.suppress(Exception):
                    ray.shutdown()
                self._stop_reaper(keep=True)  # reaps the half-started node's processes, keeps its logs
                if attempt < PRIVATE_STARTS and _SLOW_START in first:
                    log.warning("the local Ray node missed its start-up window (%s); starting again", first)
                    continue
                msg = f"cannot start a local Ray cluster ({first}); its logs are in {tmp}"
                raise CadenzaError(msg) from None
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, _on_sigterm)  # ray.init installed its own: ours unwinds the same
        self._started = True

    def _stop_reaper(self, *, keep: bool = False) -> None:
        """Reap what is left of the private cluster (nothing, after a clean ``ray.shutdown``)."""
        if self._reaper is not None:
            reaper.stop(self._reaper, keep=keep)
            self._reaper = None
        if self._old_sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None

    def _channel(self) -> _Events:
        """The progress channel, an actor of its own: started only for units (``submit``) or a reader
        (``events``), never for callers that only run actors (the rollout workers, the engines)."""
        if self._events is None:
            from ray.util.queue import Queue

            self._queue = Queue(actor_options={"num_cpus": 0})
            self._events = _Events(self._queue, self)
        return self._events

    # ------------------------------------------------------------------ the seam

    def submit(self, fn: Callable[..., Any], *args: Any, num_cpus: int = 1) -> Future[Any]:
        import ray

        unit = next(self._units)
        remote = ray.remote(_call).options(
            num_cpus=num_cpus, max_retries=self.cfg.max_retries, retry_exceptions=False
        )
        self._channel()
        return remote.remote(self._queue, unit, fn, *args).future()

    def actor(self, cls: type, *args: Any, num_cpus: int = 1) -> Any:
        """A Ray actor of ``cls(*args)``; not restarted by Ray (callers replace dead actors themselves,
        so they know which unit was lost)."""
        import ray

        return ray.remote(cls).options(num_cpus=num_cpus, max_restarts=0).remote(*args)

    def events(self) -> EventQueue:
        return self._channel()

    def retries(self) -> int:
        """Units re-run after their worker died (as far as their start messages arrived)."""
        return sum(n - 1 for n in self.starts.values() if n > 1)

    def run_on_every_node(self, fn: Callable[[], Any], timeout_s: float = 60.0) -> dict[str, Any]:
        """``fn()`` once on each alive node: ``{node_id: result or exception}``."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
        refs = [
            ray.remote(_probe)
            .options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False))
            .remote(fn)
            for n in nodes
        ]
        try:
            return dict(ray.get(refs, timeout=timeout_s))
        except ray.exceptions.GetTimeoutError:
            raise CadenzaError(
                f"Ray nodes did not answer a {timeout_s:.0f} s probe; check `ray status` on the cluster"
            ) from None

    def close(self) -> None:
        import ray

        if ray.is_initialized():
            if self._queue is not None:
                with contextlib.suppress(Exception):
                    ray.kill(self._queue.actor)
            ray.shutdown()
        self._stop_reaper()
        if self._started and self._tmp is not None:  # session files of a private cluster
            shutil.rmtree(self._tmp, ignore_errors=True)
        for key, old in self._saved_env.items():  # what _start_private changed in this process
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
        self._saved_env = {}


def is_lost(exc: BaseException) -> bool:
    """Whether a unit's failure means its worker or node died (after Ray's retries), not a bug in it."""
    return any(type(exc).__name__ == name or name in type(exc).__name__ for name in LOST_ERRORS)
