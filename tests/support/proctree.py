"""Real process trees for SIGTERM tests: start a command, wait until it has N worker processes, send
``SIGTERM`` to the parent alone (as ``kill -TERM``, a scheduler or a CI runner does), and report which of
the descendants seen before the signal are still alive afterwards."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path


def _ppid_map() -> dict[int, int]:
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after the last ')'
        out[int(d.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return out


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (children, grandchildren, ...)."""
    parents = _ppid_map()
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier and p not in found}
        found |= frontier
    return found


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def running(pid: int, needle: bytes) -> set[int]:
    """Descendants of ``pid`` whose command line contains ``needle``."""
    out = set()
    for p in descendants(pid):
        try:
            if needle in Path(f"/proc/{p}/cmdline").read_bytes():
                out.add(p)
        except OSError:
            continue
    return out


def sigterm_leaves(
    cmd: list[str],
    *,
    workers: int,
    needle: bytes = b"spawn_main",
    env: dict[str, str] | None = None,
    start_timeout: float = 300,
    grace: float = 10.0,
    cwd: str | None = None,
) -> tuple[set[int], set[int], int | None]:
    """Run ``cmd``; once ``workers`` processes below it have ``needle`` in their command line (default:
    multiprocessing spawn workers), ``SIGTERM`` the parent only; wait ``grace`` seconds.

    Returns (descendants seen just before the signal, those still alive after ``grace``, the parent's
    return code). The caller kills any survivor (the test must not leave them computing)."""
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + start_timeout
        while len(running(proc.pid, needle)) < workers:
            if proc.poll() is not None:
                raise AssertionError(
                    f"exited before its workers started: {proc.stderr.read().decode()[-2000:]}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"no {workers} workers after {start_timeout}s")
            time.sleep(0.2)
        time.sleep(2.0)  # the workers are now inside their jobs
        before = descendants(proc.pid)
        os.kill(proc.pid, signal.SIGTERM)
        rc = proc.wait(timeout=60)
        end = time.monotonic() + grace
        while time.monotonic() < end and any(alive(p) for p in before):
            time.sleep(0.2)
        return before, {p for p in before if alive(p)}, rc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def kill_all(pids: set[int]) -> None:
    for p in pids:
        with contextlib.suppress(OSError):
            os.kill(p, signal.SIGKILL)
