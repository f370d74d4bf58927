"""CPU time of a whole process tree, daemons and orphans included: a cgroup v1 ``cpuacct`` group.

A process is born into its parent's cgroup and stays there when it is reparented to init, so a group
around one process counts every descendant it ever starts: Ray's raylet, agents and workers, vLLM's
engine core, sandboxed pytest runs. ``getrusage`` counts only the children a process waited for.
Used by ``bench/sandbox.py`` and by the per-test CPU log (``CADENZA_TEST_CPU_LOG``, tests/conftest.py).
The ``cpuacct`` hierarchy only accounts (it is mounted apart from ``cpu`` here), so entering a group
does not change scheduling; where it is not writable every figure is ``None``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
_BEFORE: dict[Path, Path] = {}  # group -> the group this process was in before entering it


def _current() -> Path:
    """This process's cpuacct group now (from ``/proc/self/cgroup``)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpuacct" in controllers.split(","):
            return CPUACCT / path.lstrip("/")
    return CPUACCT


def enter(name: str) -> Path | None:
    """A new group ``name`` holding this process (what it starts from now on is born in it), or None."""
    group = CPUACCT / name
    try:
        before = _current()
        group.mkdir()
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError:
        with contextlib.suppress(OSError):
            group.rmdir()
        return None
    _BEFORE[group] = before
    return group


def usage(group: Path | None) -> float | None:
    """CPU seconds used so far by every process that was ever in ``group``."""
    return int((group / "cpuacct.usage").read_text()) / 1e9 if group else None


def leave(group: Path | None) -> None:
    """Move this process back to the group it was in before and remove ``group`` (kept while processes
    remain)."""
    if group is None:
        return
    with contextlib.suppress(OSError):
        (_BEFORE.pop(group, CPUACCT) / "cgroup.procs").write_text(str(os.getpid()))
        group.rmdir()


@contextlib.contextmanager
def meter(name: str) -> Iterator[Path | None]:
    """``enter(name)`` for the block, then ``leave``."""
    group = enter(name)
    try:
        yield group
    finally:
        leave(group)
