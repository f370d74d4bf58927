"""Sandbox cost: per-call latency of a trivial command, and grading time vs running the same tests bare.

Prints ONE JSON object. Targets: median per-call overhead under 10 ms; grading at most 1.5x the bare
test run. The task is the built-in toy task; its environment is this interpreter's (it has pytest).
Both sandbox modes are measured: ``per_call`` (one bubblewrap per command, what grading uses) and
``persistent`` (one bubblewrap per episode with an exec server inside, what episodes use; its one-time
start is reported separately). Calls are interleaved (bare, per-call, persistent, bare, ...) so machine
load hits all sides alike.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cadenza.agent.grading.grade import grade
from cadenza.agent.toytask import F2P, P2P, make_task
from cadenza.sandbox import Sandbox, SandboxConfig
from cadenza.tasks.records.task import WORKSPACE

CALLS = 60
GRADES = 7
TARGET_MS = 10.0


def main() -> None:
    env = Path(sys.prefix)
    with tempfile.TemporaryDirectory(prefix="cadenza-bench-") as tmp:
        task_dir = make_task(Path(tmp) / "taskset", "calc-clamp", env)
        solved = Path(tmp) / "solved"
        shutil.copytree(task_dir / WORKSPACE, solved)
        subprocess.run(["git", "apply", str(task_dir / "gold.patch")], cwd=solved, check=True)

        box = Sandbox(solved, env_dir=env, config=SandboxConfig(persistent=False), hidden=[task_dir.parent])
        kept = Sandbox(solved, env_dir=env, config=SandboxConfig(persistent=True), hidden=[task_dir.parent])
        t0 = time.perf_counter()
        assert kept.run(["true"]).exit_code == 0 and kept.persistent  # starts the instance
        startup_ms = (time.perf_counter() - t0) * 1e3
        raw_bwrap = box.argv(["true"])
        bare_calls, bwrap_calls, boxed_calls, kept_calls = [], [], [], []
        for _ in range(CALLS):
            t0 = time.perf_counter()
            subprocess.run(["true"], stdin=subprocess.DEVNULL, capture_output=True)
            bare_calls.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            subprocess.run(
                raw_bwrap, stdin=subprocess.DEVNULL, capture_output=True, env={"PATH": "/usr/bin:/bin"}
            )
            bwrap_calls.append(time.perf_counter() - t0)
            for sandbox, times in ((box, boxed_calls), (kept, kept_calls)):
                t0 = time.perf_counter()
                res = sandbox.run(["true"])
                times.append(time.perf_counter() - t0)
                assert res.exit_code == 0, res
        box.close()
        kept.close()

        bare_tests, graded = [], []
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *F2P, *P2P]
        for _ in range(GRADES):
            with tempfile.TemporaryDirectory() as run_dir:
                ws = Path(run_dir) / "ws"
                shutil.copytree(solved, ws)
                t0 = time.perf_counter()
                out = subprocess.run(argv, cwd=ws, capture_output=True, stdin=subprocess.DEVNULL)
                bare_tests.append(time.perf_counter() - t0)
                assert out.returncode == 0, out.stdout
            result = grade(task_dir, solved)
            assert result.resolved, result
            graded.append(result.duration_s)

    modes = {
        "per_call": _mode(bare_calls, boxed_calls),
        "persistent": {**_mode(bare_calls, kept_calls), "startup_ms": round(startup_ms, 2)},
    }
    ratio = statistics.median(graded) / statistics.median(bare_tests)
    print(
        json.dumps(
            {
                "bench": "sandbox",
                "calls": CALLS,
                "bare_call_median_ms": round(statistics.median(bare_calls) * 1e3, 2),
                "raw_bwrap_call_median_ms": round(
                    statistics.median(bwrap_calls) * 1e3, 2
                ),  # same bwrap line, no limits/capture
                **modes,
                "overhead_target_ms": TARGET_MS,
                "overhead_median_ms": modes["persistent"]["overhead_median_ms"],  # what episodes use
                "overhead_ok": modes["persistent"]["overhead_ok"],
                "grades": GRADES,
                "bare_tests_median_s": round(statistics.median(bare_tests), 3),
                "grade_median_s": round(statistics.median(graded), 3),
                "grade_ratio": round(ratio, 3),
                "grade_ratio_target": 1.5,
                "grade_ratio_ok": ratio <= 1.5,
                "process_limit_enforced": box.process_limit_enforced,
                "loadavg_1m": round(os.getloadavg()[0], 2),
                "cpus": os.cpu_count(),
            }
        )
    )


def _mode(bare: list[float], boxed: list[float]) -> dict[str, float | bool]:
    """Median call time, and the median of paired (same round) differences to the bare subprocess."""
    overhead = statistics.median(b - a for a, b in zip(bare, boxed, strict=True)) * 1e3
    return {
        "call_median_ms": round(statistics.median(boxed) * 1e3, 2),
        "overhead_median_ms": round(overhead, 2),
        "call_minus_bare_median_ms": round((statistics.median(boxed) - statistics.median(bare)) * 1e3, 2),
        "overhead_ok": overhead < TARGET_MS,
    }


if __name__ == "__main__":
    main()
