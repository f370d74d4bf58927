"""The per-test CPU meter counts a daemon nobody waits for (what ``getrusage`` misses: Ray's and vLLM's
processes), and only processes started inside its group."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.support import cpuacct

# a grandchild, detached from its parent (which exits at once), burns 0.5 s of CPU
DAEMON = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    t = time.process_time()
    while time.process_time() - t < 0.5:
        pass
    open(sys.argv[1], "w").close()
    os._exit(0)
"""


BUSY = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3:\n    pass"


def test_a_detached_grandchilds_cpu_is_counted(tmp_path):
    done = tmp_path / "done"
    with cpuacct.meter(f"cadenza-test-meter-{os.getpid()}") as group:
        if group is None:
            pytest.skip("the cgroup v1 cpuacct hierarchy is not writable here")
        before = cpuacct.usage(group)
        subprocess.run([sys.executable, "-c", DAEMON, str(done)], check=True, timeout=60)
        deadline = time.monotonic() + 60
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert done.exists()
        time.sleep(0.2)  # the grandchild's exit
        assert cpuacct.usage(group) - before >= 0.45
    assert not group.exists()  # removed on leaving


def test_leaving_returns_to_the_group_before(tmp_path):
    with cpuacct.meter(f"cadenza-test-outer-{os.getpid()}") as outer:
        if outer is None:
            pytest.skip("the cgroup v1 cpuacct hierarchy is not writable here")
        with cpuacct.meter(f"cadenza-test-inner-{os.getpid()}") as inner:
            assert cpuacct._current() == inner
        assert cpuacct._current() == outer  # the worker's own meter keeps counting after a nested one


def test_cpu_outside_the_group_is_not_counted(tmp_path):
    with cpuacct.meter(f"cadenza-test-meter-{os.getpid()}") as group:
        if group is None:
            pytest.skip("the cgroup v1 cpuacct hierarchy is not writable here")
        cpuacct.leave(group)  # this process out: what it starts now is born outside
        group.mkdir()
        cpuacct._BEFORE[group] = cpuacct._current()
        before = cpuacct.usage(group)
        subprocess.run([sys.executable, "-c", BUSY], check=True, timeout=60)
        assert cpuacct.usage(group) - before < 0.05
