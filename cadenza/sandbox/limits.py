"""Kernel limits for sandboxed process trees: rlimits, and a pids cgroup where one is writable.

RLIMIT_NPROC does not bind root (the kernel exempts uid 0), so when running as root a fork bomb is
contained by a per-call pids cgroup (v1 ``pids`` hierarchy or a v2 hierarchy with the ``pids``
controller). The cgroup also gives a complete list of the tree's processes to kill.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import resource
import signal
import time
from pathlib import Path

from cadenza.sandbox.config import SandboxConfig

_counter = itertools.count()


def rlimits(config: SandboxConfig) -> list[tuple[int, tuple[int, int]]]:
    return [
        (resource.RLIMIT_CPU, (config.cpu_s, config.cpu_s + 5)),
        (resource.RLIMIT_AS, (config.memory_bytes, config.memory_bytes)),
        (resource.RLIMIT_FSIZE, (config.max_file_bytes, config.max_file_bytes)),
        (resource.RLIMIT_CORE, (0, 0)),
        (resource.RLIMIT_NPROC, (_nproc_limit(config), _nproc_limit(config))),
    ]


def _nproc_limit(config: SandboxConfig) -> int:
    # RLIMIT_NPROC counts every process of the uid, not only the sandbox's: leave room for the
    # caller's own processes (root is exempt anyway and relies on the pids cgroup).
    if os.geteuid() == 0:
        return config.max_procs
    return config.max_procs + _processes_of_uid(os.geteuid())


def _processes_of_uid(uid: int) -> int:
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if entry.stat().st_uid == uid:
                    count += 1
    return count


@functools.lru_cache(maxsize=1)
def pids_cgroup_root() -> Path | None:
    """A writable cgroup directory with the pids controller, or None."""
    candidates: list[Path] = []
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
        own = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    own_v1 = {}
    own_v2 = ""
    for line in own:
        hid, controllers, path = line.split(":", 2)
        if hid == "0":
            own_v2 = path
        for c in controllers.split(","):
            own_v1[c] = path
    for line in mounts:
        parts = line.split()
        if len(parts) < 4:
            continue
        mnt, fstype, opts = parts[1], parts[2], parts[3].split(",")
        if fstype == "cgroup" and "pids" in opts:
            candidates.append(Path(mnt) / own_v1.get("pids", "/").lstrip("/"))
        elif fstype == "cgroup2":
            base = Path(mnt) / own_v2.lstrip("/")
            with contextlib.suppress(OSError):
                if "pids" in (base / "cgroup.subtree_control").read_text().split():
                    candidates.append(base)
    for base in candidates:
        _remove_stale(base)
        probe = base / f"cadenza-probe-{os.getpid()}"
        try:
            probe.mkdir()
        except OSError:
            continue
        try:
            if (probe / "pids.max").exists():
                return base
        finally:
            with contextlib.suppress(OSError):
                probe.rmdir()
    return None


def _remove_stale(base: Path) -> None:
    """Remove empty cgroups left by cadenza processes that were killed before cleaning up."""
    with contextlib.suppress(OSError):
        for entry in base.iterdir():
            parts = entry.name.split("-")
            if (
                parts[0] == "cadenza"
                and len(parts) >= 2
                and parts[1].isdigit()
                and not Path(f"/proc/{parts[1]}").exists()
            ):
                with contextlib.suppress(OSError):
                    entry.rmdir()


class PidsCgroup:
    """One cgroup per call: caps the number of processes, and lists them for the final kill."""

    def __init__(self, root: Path, max_procs: int) -> None:
        self.path = root / f"cadenza-{os.getpid()}-{next(_counter)}"
        self.path.mkdir()
        (self.path / "pids.max").write_text(str(max_procs))
        self._procs = str(self.path / "cgroup.procs")

    def join(self) -> None:
        """Move the calling process in (runs in the child between fork and exec)."""
        fd = os.open(self._procs, os.O_WRONLY)
        try:
            os.write(fd, str(os.getpid()).encode())
        finally:
            os.close(fd)

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in Path(self._procs).read_text().split()]
        except OSError:
            return []

    def kill_all(self, spare: int | None = None, wait_s: float = 0.0) -> None:
        """SIGKILL every process but ``spare`` (daemons, a sandbox init still reaping) and wait up to
        ``wait_s`` until they are gone, so nothing of a call outlives it."""
        deadline = time.monotonic() + wait_s
        while True:
            left = [pid for pid in self.pids() if pid != spare]
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            if not left or time.monotonic() >= deadline:
                return
            time.sleep(0.0005)

    def kill_all_and_remove(self, timeout_s: float = 5.0) -> None:
        self.kill_all(wait_s=timeout_s)
        with contextlib.suppress(OSError):
            self.path.rmdir()


def make_preexec(config: SandboxConfig, cgroup: PidsCgroup | None):
    limits = rlimits(config)

    def preexec() -> None:
        if cgroup is not None:
            cgroup.join()
        for res, value in limits:
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(res, value)

    return preexec
