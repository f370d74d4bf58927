"""A private cluster whose node misses Ray's fixed 30 s start-up window (seen at load 14 on 2 cores) is
reaped and started once more in a fresh directory; any other start failure, or a second miss, is one line.

``ray`` here is a stand-in whose ``init`` leaves a real process holding a log file in the cluster's
directory (what a half-started raylet leaves) and raises Ray's own words: the reaper and the retry are
the real ones."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from cadenza.errors import CadenzaError
from cadenza.executor import ray as ray_executor
from cadenza.executor.base import ExecutorConfig

SLOW = "The current node timed out during startup. This could happen because some of the raylet failed"


class FakeRay:
    def __init__(self, failures: list[str]) -> None:
        self.failures = failures
        self.dirs: list[Path] = []
        self.procs: list[subprocess.Popen] = []

    def init(self, **kw) -> None:
        tmp = Path(kw["_temp_dir"])
        self.dirs.append(tmp)
        if self.failures:
            hold = f"f = open({str(tmp / 'raylet.out')!r}, 'w'); import time; time.sleep(300)"
            self.procs.append(subprocess.Popen([sys.executable, "-c", hold]))
            time.sleep(0.5)  # the file is open before the failure is seen
            raise Exception(self.failures.pop(0))

    def shutdown(self) -> None:
        pass


def _executor(tmp_path: Path) -> ray_executor.RayExecutor:
    ex = object.__new__(ray_executor.RayExecutor)
    ex.cfg = ExecutorConfig(workers=1, run_dir=str(tmp_path))
    ex._reaper, ex._old_sigterm, ex._started, ex._tmp = None, None, False, None
    return ex


def test_a_missed_start_window_is_retried_in_a_fresh_directory(tmp_path: Path) -> None:
    ray, ex = FakeRay([SLOW]), _executor(tmp_path)
    try:
        ex._start_private(ray)
        assert ex._started and len(ray.dirs) == 2 and ray.dirs[0] != ray.dirs[1]
        assert ray.procs[0].wait(timeout=30) is not None  # the half-started node was reaped
    finally:
        ex._stop_reaper()


@pytest.mark.parametrize("failures", [[SLOW, SLOW], ["some other failure"]])
def test_other_failures_and_a_second_miss_are_one_line(tmp_path: Path, failures: list[str]) -> None:
    ray, ex = FakeRay(list(failures)), _executor(tmp_path)
    with pytest.raises(CadenzaError, match="cannot start a local Ray cluster") as err:
        ex._start_private(ray)
    assert len(ray.dirs) == len(failures) and not ex._started
    assert str(ray.dirs[-1]) in str(err.value) and "\n" not in str(err.value)
    assert all(p.wait(timeout=30) is not None for p in ray.procs)
