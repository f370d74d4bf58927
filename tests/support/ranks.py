"""Start ``world`` processes as torchrun would (RANK, LOCAL_RANK, WORLD_SIZE, a file rendezvous), for the
tests that run a real multi-process job through its command line."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path


def start_ranks(cmd: list[str], world: int, tmp: Path, extra_env: dict[str, str] | None = None):
    """One ``Popen`` per rank (stdout and stderr merged, text), on a fresh rendezvous file under ``tmp``."""
    rdzv = tmp / f"rendezvous-{world}-{time.monotonic_ns()}"
    env = {**os.environ, "WORLD_SIZE": str(world), "CADENZA_INIT_METHOD": f"file://{rdzv}"}
    env.update({"OMP_NUM_THREADS": "1", **(extra_env or {})})
    return [
        subprocess.Popen(cmd, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
        for r in range(world)
    ]  # fmt: skip


def run_ranks(
    cmd: list[str], world: int, tmp: Path, *, timeout: float = 900, check: bool = True
) -> list[tuple[int, str]]:
    """Run ``cmd`` on ``world`` ranks to the end (every rank killed after ``timeout`` s); each rank's exit
    code and output. ``check``: assert every rank exited 0, naming the first that did not."""
    procs = start_ranks(cmd, world, tmp)
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            p.kill()
    for r, (p, out) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0 or not check, f"rank {r} failed:\n{out[-4000:]}"
    return [(p.returncode, out) for p, out in zip(procs, outs, strict=True)]
