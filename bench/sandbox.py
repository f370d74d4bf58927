"""Sandbox cost: per-call latency of a trivial command, and grading time vs running the same tests bare.

Prints ONE JSON object. Targets: median per-call overhead under 10 ms; grading under 1.3x the bare
test run. The task is the built-in toy task; its environment is this interpreter's (it has pytest).
Calls are interleaved (bare, sandboxed, bare, ...) so machine load hits both sides alike.
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

from cadenza.agent.grade import grade
from cadenza.agent.toytask import F2P, P2P, make_task
from cadenza.sandbox import Sandbox, SandboxConfig
from cadenza.tasks.task import WORKSPACE

CALLS = 60
GRADES = 7


def main() -> None:
    env = Path(sys.prefix)
    with tempfile.TemporaryDirectory(prefix="cadenza-bench-") as tmp:
        task_dir = make_task(Path(tmp) / "taskset", "calc-clamp", env)
        solved = Path(tmp) / "solved"
        shutil.copytree(task_dir / WORKSPACE, solved)
        subprocess.run(["git", "apply", str(task_dir / "gold.patch")], cwd=solved, check=True)

        box = Sandbox(solved, env_dir=env, config=SandboxConfig(), hidden=[task_dir.parent])
        raw_bwrap = box.argv(["true"])
        bare_calls, bwrap_calls, boxed_calls = [], [], []
        for _ in range(CALLS):
            t0 = time.perf_counter()
            subprocess.run(["true"], stdin=subprocess.DEVNULL, capture_output=True)
            bare_calls.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            subprocess.run(raw_bwrap, stdin=subprocess.DEVNULL, capture_output=True, env={"PATH": "/usr/bin:/bin"})
            bwrap_calls.append(time.perf_counter() - t0)
            res = box.run(["true"])
            assert res.exit_code == 0, res
            boxed_calls.append(res.duration_s)

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

    bare_ms = statistics.median(bare_calls) * 1e3
    boxed_ms = statistics.median(boxed_calls) * 1e3
    overhead = statistics.median(b - a for a, b in zip(bare_calls, boxed_calls, strict=True)) * 1e3
    ratio = statistics.median(graded) / statistics.median(bare_tests)
    print(json.dumps({
        "bench": "sandbox",
        "calls": CALLS,
        "bare_call_median_ms": round(bare_ms, 2),
        "sandbox_call_median_ms": round(boxed_ms, 2),
        "raw_bwrap_call_median_ms": round(statistics.median(bwrap_calls) * 1e3, 2),  # same bwrap line, no limits/capture
        "overhead_median_ms": round(overhead, 2),
        "overhead_target_ms": 10.0,
        "overhead_ok": overhead < 10.0,
        "grades": GRADES,
        "bare_tests_median_s": round(statistics.median(bare_tests), 3),
        "grade_median_s": round(statistics.median(graded), 3),
        "grade_ratio": round(ratio, 3),
        "grade_ratio_target": 1.3,
        "grade_ratio_ok": ratio < 1.3,
        "pids_cgroup": box.process_limit_enforced,
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }))


if __name__ == "__main__":
    main()
