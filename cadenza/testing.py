"""Helpers for running real ``torch.distributed`` process groups (gloo, CPU) in tests and benchmarks.

``spawn(fn, world_size, *args)`` starts ``world_size`` processes, initialises a gloo process
group in each, calls ``fn(rank, world_size, *args)`` and returns the per-rank results (anything
picklable). A failure on any rank re-raises in the parent with that rank's traceback.

The ranks meet through a ``FileStore`` in a private temporary directory, not a ``TCPStore``: torch's
TCPStore server listens on every interface (``::``) whatever host it is given, and nothing here may
listen beyond loopback. (gloo's own pair sockets bind to the resolved 127.0.0.1.)
"""

from __future__ import annotations

import os
import socket
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world_size: int, store: str, fn: Callable, args: tuple, queue: Any) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        OMP_NUM_THREADS="1",
    )
    import torch

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
        result = fn(rank, world_size, *args)
        queue.put((rank, "ok", result))
    except BaseException:
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn(
    fn: Callable, world_size: int, *args: Any, timeout: float = 600.0, preload: tuple[str, ...] = ()
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo ranks; return results by rank.

    ``preload`` (e.g. ``("torch", "transformers")``) forks ranks from a forkserver that imported those
    modules once, instead of every rank importing them: 8 ranks importing transformers on 2 cores take
    over a minute, forking takes seconds. The forkserver is per process, so the first preload wins.
    """
    if preload:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload([*preload, fn.__module__])
    else:
        ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    tmp = tempfile.TemporaryDirectory(prefix="cadenza-spawn-")
    store = os.path.join(tmp.name, "store")
    procs = [
        ctx.Process(target=_worker, args=(r, world_size, store, fn, args, queue), daemon=True)
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: list[str] = []
    try:
        for _ in range(world_size):
            rank, status, payload = queue.get(timeout=timeout)
            if status == "ok":
                results[rank] = payload
            else:
                errors.append(f"rank {rank} failed:\n{payload}")
                break
    finally:
        for p in procs:
            p.join(timeout=5 if errors else 60)
            if p.is_alive():
                p.kill()
        tmp.cleanup()
    if errors:
        raise RuntimeError("\n".join(errors))
    return [results[r] for r in range(world_size)]
