"""Sandbox cost: per-call latency of a trivial command, and grading time vs running the same tests bare.

Prints ONE JSON object. Targets: median per-call overhead under 10 ms; grading at most 1.5x the bare
test run. The task is the built-in toy task (its environment is this interpreter's, which has pytest),
or with ``--task DIR`` a built task (its gold patch applied; the bare run uses its environment's python).
Both sandbox modes are measured: ``per_call`` (one bubblewrap per command, what grading uses) and
``persistent`` (one bubblewrap per episode with an exec server inside, what episodes use; its one-time
start is reported separately). Calls are interleaved (bare, per-call, persistent, bare, ...) so machine
load hits all sides alike; so are bare test runs and grades.

Wall time depends on free cores (grading's F2P-alone rerun runs beside the main run): the CPU time of
each side is reported too, with a bare run of the F2P tests alone (the least any second look at them
costs, so ``rerun_floor_cpu_ratio`` is the CPU ratio no grading with the rerun can beat), measured
with a cgroup v1 ``cpuacct`` group around this process and all its descendants (sandboxed ones
included) where that hierarchy is writable (``null`` elsewhere).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cadenza.agent.grading.grade import grade
from cadenza.agent.grading.policy import Defences
from cadenza.agent.toytask import make_task
from cadenza.sandbox import Sandbox, SandboxConfig
from cadenza.tasks.records.task import WORKSPACE, load_task, task_env_dir, task_python
from tests.support import cpuacct

CALLS = 60
GRADES = 7
TARGET_MS = 10.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", type=Path, help="a built task directory (default: the toy task)")
    ap.add_argument("--grades", type=int, default=GRADES)
    ap.add_argument("--calls", type=int, default=CALLS)
    args = ap.parse_args()
    meter = cpuacct.meter(f"cadenza-bench-{os.getpid()}")
    with tempfile.TemporaryDirectory(prefix="cadenza-bench-") as tmp, meter as cpu:
        task_dir = (
            args.task.absolute()
            if args.task
            else make_task(Path(tmp) / "taskset", "calc-clamp", Path(sys.prefix))
        )
        task = load_task(task_dir)
        env = task_env_dir(task_dir, task)
        solved = Path(tmp) / "solved"
        shutil.copytree(task_dir / WORKSPACE, solved, symlinks=True)
        subprocess.run(["git", "apply", str(task_dir / "gold.patch")], cwd=solved, check=True, timeout=60)
        calls = _calls(solved, env, task_dir, args.calls)
        pytest_argv = [str(task_python(task_dir, task)), "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        bare_argv = [*pytest_argv, *task.fail_to_pass, *task.pass_to_pass]
        runs: dict[str, list[tuple[float, float | None]]] = {
            "bare": [],
            "bare_f2p": [],
            "grade": [],
            "no_rerun": [],
        }
        phases: list[dict[str, float]] = []
        for _ in range(args.grades):
            _bare(solved, bare_argv, runs["bare"], cpu)
            # the least a second look at the F2P tests can cost: them alone, bare
            _bare(solved, pytest_argv + list(task.fail_to_pass), runs["bare_f2p"], cpu)
            with _timed(runs["grade"], cpu):
                result = grade(task_dir, solved, task=task)
            assert result.resolved and not result.tampering, result
            phases.append(result.phases)
            with _timed(runs["no_rerun"], cpu):  # for reference only: the rerun is always on in grading
                assert grade(task_dir, solved, task=task, defences=Defences(f2p_rerun=False)).resolved

    wall = {k: statistics.median(w for w, _ in v) for k, v in runs.items()}
    cpus = {k: statistics.median(c for _, c in v) if cpu else None for k, v in runs.items()}
    ratio = wall["grade"] / wall["bare"]
    print(
        json.dumps(
            {
                "bench": "sandbox",
                "task": task.id,
                "tests": {"f2p": len(task.fail_to_pass), "p2p": len(task.pass_to_pass)},
                **calls,
                "grades": args.grades,
                "bare_tests_median_s": round(wall["bare"], 3),
                "grade_median_s": round(wall["grade"], 3),
                "grade_ratio": round(ratio, 3),
                "grade_ratio_target": 1.5,
                "grade_ratio_ok": ratio <= 1.5,
                "grade_no_rerun_median_s": round(wall["no_rerun"], 3),  # reference: F2P rerun off
                "grade_phases_median_s": {
                    k: round(statistics.median(p.get(k, 0.0) for p in phases), 3) for k in phases[0]
                },
                "cpu_measured": cpu is not None,
                "bare_tests_cpu_s": _r(cpus["bare"]),
                "grade_cpu_s": _r(cpus["grade"]),
                "grade_no_rerun_cpu_s": _r(cpus["no_rerun"]),
                "grade_cpu_ratio": _r(cpus["grade"] / cpus["bare"]) if cpu else None,
                "grade_cpu_ratio_no_rerun": _r(cpus["no_rerun"] / cpus["bare"]) if cpu else None,
                # a bare run of the F2P tests alone, and the CPU ratio grading cannot go under while it
                # reruns them: its no-rerun cost plus that bare F2P run (grading's rerun is this run in
                # a sandbox, under the guard)
                "bare_f2p_cpu_s": _r(cpus["bare_f2p"]),
                "rerun_floor_cpu_ratio": _r((cpus["no_rerun"] + cpus["bare_f2p"]) / cpus["bare"])
                if cpu
                else None,
                "loadavg_1m": round(os.getloadavg()[0], 2),
                "cpus": os.cpu_count(),
                "commit": _commit(),
            }
        )
    )


def _bare(solved: Path, argv: list[str], into: list[tuple[float, float | None]], cpu: Path | None) -> None:
    """``argv`` (pytest, no sandbox) timed into ``into``, over a fresh copy of ``solved`` whose code comes
    first on the path, as an editable install of it gives (a built task's env points at the pristine
    workspace)."""
    with tempfile.TemporaryDirectory() as run_dir:
        ws = Path(run_dir) / "ws"
        shutil.copytree(solved, ws, symlinks=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in (ws / "src", ws) if p.is_dir())}
        with _timed(into, cpu):
            out = subprocess.run(
                argv, cwd=ws, env=env, capture_output=True, stdin=subprocess.DEVNULL, timeout=900
            )
        assert out.returncode == 0, out.stdout[-2000:]


def _calls(solved: Path, env: Path, task_dir: Path, n: int) -> dict:
    """Per-call latency of ``true``: bare, the raw bwrap line, per-call and persistent sandboxes."""
    box = Sandbox(solved, env_dir=env, config=SandboxConfig(persistent=False), hidden=[task_dir.parent])
    kept = Sandbox(solved, env_dir=env, config=SandboxConfig(persistent=True), hidden=[task_dir.parent])
    t0 = time.perf_counter()
    assert kept.run(["true"]).exit_code == 0 and kept.persistent  # starts the instance
    startup_ms = (time.perf_counter() - t0) * 1e3
    raw_bwrap = box.argv(["true"])
    bare_calls, bwrap_calls, boxed_calls, kept_calls = [], [], [], []
    for _ in range(n):
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
    process_limit = box.process_limit_enforced
    box.close()
    kept.close()
    modes = {
        "per_call": _mode(bare_calls, boxed_calls),
        "persistent": {**_mode(bare_calls, kept_calls), "startup_ms": round(startup_ms, 2)},
    }
    return {
        "calls": n,
        "bare_call_median_ms": round(statistics.median(bare_calls) * 1e3, 2),
        "raw_bwrap_call_median_ms": round(statistics.median(bwrap_calls) * 1e3, 2),  # no limits/capture
        **modes,
        "overhead_target_ms": TARGET_MS,
        "overhead_median_ms": modes["persistent"]["overhead_median_ms"],  # what episodes use
        "overhead_ok": modes["persistent"]["overhead_ok"],
        "process_limit_enforced": process_limit,
    }


def _mode(bare: list[float], boxed: list[float]) -> dict[str, float | bool]:
    """Median call time, and the median of paired (same round) differences to the bare subprocess."""
    overhead = statistics.median(b - a for a, b in zip(bare, boxed, strict=True)) * 1e3
    return {
        "call_median_ms": round(statistics.median(boxed) * 1e3, 2),
        "overhead_median_ms": round(overhead, 2),
        "call_minus_bare_median_ms": round((statistics.median(boxed) - statistics.median(bare)) * 1e3, 2),
        "overhead_ok": overhead < TARGET_MS,
    }


@contextlib.contextmanager
def _timed(into: list[tuple[float, float | None]], cpu: Path | None) -> Iterator[None]:
    """Append (wall seconds, CPU seconds of this process tree or None) of the block to ``into``."""
    c0, t0 = cpuacct.usage(cpu), time.perf_counter()
    yield
    wall, c1 = time.perf_counter() - t0, cpuacct.usage(cpu)
    into.append((wall, None if c0 is None or c1 is None else c1 - c0))


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=30,
                         cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    return out.stdout.strip()


if __name__ == "__main__":
    main()
