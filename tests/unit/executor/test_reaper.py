"""The cluster supervisor's ``ray stop`` is scoped to one directory: it stops the processes that use it
and all their descendants (even one that never touched it), frees the ``/dev/shm`` files they mapped,
removes the directory, and spares a process of another directory; its supervisor reaps when the
driver dies by SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from cadenza.executor import reaper

# Holds an open file under its directory (like a Ray process its log), maps a /dev/shm file, and starts
# a child that runs elsewhere and holds nothing there (like a unit's pytest run).
HOLDER = """
import mmap, os, subprocess, sys, time
log = open(os.path.join(sys.argv[1], "proc.log"), "w")
fd = os.open(sys.argv[2], os.O_RDWR | os.O_CREAT, 0o600); os.ftruncate(fd, 4096)
m = mmap.mmap(fd, 4096); os.close(fd)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], cwd="/", close_fds=True)
print(child.pid, flush=True)
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _holder(root: Path, shm: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(root), shm], stdout=subprocess.PIPE, text=True)
    child = int(proc.stdout.readline())
    return proc, child


def test_reap_is_scoped_to_its_directory_and_takes_descendants(tmp_path):
    mine, other = tmp_path / "mine", tmp_path / "other"
    mine.mkdir()
    other.mkdir()
    shm_mine, shm_other = f"/dev/shm/cadenza-test-{os.getpid()}-a", f"/dev/shm/cadenza-test-{os.getpid()}-b"
    a, a_child = _holder(mine, shm_mine)
    b, b_child = _holder(other, shm_other)
    try:
        assert set(reaper.cluster_pids(mine)) == {a.pid, a_child}  # the child is found through its parent
        found = reaper.reap(mine, grace_s=2.0)
        assert set(found) == {a.pid, a_child}
        a.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _alive(a_child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(a_child) and not mine.exists() and not Path(shm_mine).exists()
        assert b.poll() is None and _alive(b_child) and Path(shm_other).exists()  # another cluster: untouched
    finally:
        _clean_up((a, b), (a_child, b_child), (shm_mine, shm_other))


def _clean_up(procs, pids, shm_files) -> None:
    """Whatever a failed test left: its processes, their children, their shared-memory files."""
    for p in procs:
        p.kill()
        p.wait()
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    for f in shm_files:
        Path(f).unlink(missing_ok=True)


DRIVER = """
import sys, time
from pathlib import Path
from cadenza.executor import reaper
sup = reaper.spawn(__import__("os").getpid(), Path(sys.argv[1]))
print(sup.pid, flush=True)
time.sleep(300)
"""


def test_supervisor_reaps_when_its_driver_is_killed(tmp_path):
    root = tmp_path / "cluster"
    root.mkdir()
    shm = f"/dev/shm/cadenza-test-{os.getpid()}-c"
    worker, child = _holder(root, shm)  # a "cluster process" that outlives the driver, as Ray's agents do
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(root)], stdout=subprocess.PIPE, text=True)
    sup = int(driver.stdout.readline())
    try:
        time.sleep(0.5)
        assert _alive(sup) and worker.poll() is None
        driver.kill()
        driver.wait()
        worker.wait(timeout=20)  # the supervisor noticed and reaped
        deadline = time.monotonic() + 20
        while (_alive(child) or _alive(sup)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child) and not _alive(sup) and not root.exists() and not Path(shm).exists()
    finally:
        _clean_up((driver, worker), (child, sup), (shm,))
