"""A supervisor that tears down a private Ray cluster when its driver dies, however it dies.

Ray fate-shares its GCS and raylet with the driver (``PR_SET_PDEATHSIG``), but not all of its
children: after a ``SIGKILL`` of the driver its dashboard and runtime-env agents (and any worker that
was busy) live on, reparented to init, and the session files stay. So a private cluster gets this
small process (``python -m cadenza.executor.reaper --parent PID --root DIR``), in its own session so
a kill of the driver's process group spares it. It waits for the driver to go (the driver's end of
its stdin closes, or its parent pid changes) or for ``stop`` on stdin, and then does a ``ray stop``
scoped to ``DIR``: every process whose command line, working directory or open files lie under
``DIR`` (the cluster's temp and session dir, unique per run) is terminated, then killed; the
``/dev/shm`` files they had mapped are unlinked and ``DIR`` is removed. Processes of other Ray
clusters on the machine are never touched.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

GRACE_S = 5.0  # SIGTERM, then SIGKILL after this


def set_pdeathsig(sig: int) -> None:
    """Ask the kernel to send ``sig`` to this process when the thread that forked it exits."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG


def shm_mapped(pids: list[int]) -> set[str]:
    """``/dev/shm`` files the given processes have mapped or open (vLLM's queues, Ray's arenas)."""
    found: set[str] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                if "/dev/shm/" in line:
                    found.add(line[line.index("/dev/shm/") :].removesuffix(" (deleted)"))
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("/dev/shm/"):
                        found.add(target.removesuffix(" (deleted)"))
    return found


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time) of a process, or None when it is gone."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return f[0], int(f[1]), int(f[19])
    return None


def _uses(pid: int, root: str) -> bool:
    proc = Path(f"/proc/{pid}")
    with contextlib.suppress(OSError):
        if root in (proc / "cmdline").read_bytes().decode(errors="replace"):
            return True
    with contextlib.suppress(OSError):
        if os.readlink(proc / "cwd").startswith(root):
            return True
    with contextlib.suppress(OSError):
        for fd in (proc / "fd").iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd).startswith(root):
                    return True
    return False


def cluster_pids(root: str | Path, *, exclude: tuple[int, ...] = ()) -> dict[int, int]:
    """Live processes of the cluster under ``root``: those whose command line, cwd or open files lie
    under it, and all their descendants (what a Ray worker started). ``{pid: start time}``."""
    prefix = str(Path(root).resolve()) + os.sep
    stats = {int(p.name): _stat(int(p.name)) for p in Path("/proc").iterdir() if p.name.isdigit()}
    live = {pid: st for pid, st in stats.items() if st is not None and st[0] not in ("Z", "X")}
    found = [pid for pid in live if pid not in exclude and _uses(pid, prefix)]
    children: dict[int, list[int]] = {}
    for pid, st in live.items():
        children.setdefault(st[1], []).append(pid)
    out: dict[int, int] = {}
    while found:
        pid = found.pop()
        if pid not in out and pid not in exclude:
            out[pid] = live[pid][2]
            found += children.get(pid, [])
    return out


def reap(
    root: str | Path, *, grace_s: float = GRACE_S, exclude: tuple[int, ...] = (), keep: bool = False
) -> list[int]:
    """Stop every process of the cluster under ``root``, free its shared memory, remove ``root``
    (``keep``: leave its files, e.g. the logs of a cluster that failed to start).

    Returns the pids it found. Every process seen once is followed until it is gone (a child
    reparented to init when its Ray worker died is still ours), and the scan repeats while it waits."""
    exclude = (*exclude, os.getpid())
    seen: dict[int, int] = {}
    shm: set[str] = set()
    deadline = time.monotonic() + grace_s
    sig = signal.SIGTERM
    while time.monotonic() < deadline + grace_s + 5:
        seen.update(cluster_pids(root, exclude=exclude))
        pids = [p for p, t in seen.items() if (st := _stat(p)) and st[2] == t and st[0] not in ("Z", "X")]
        if not pids:
            break
        shm |= shm_mapped(pids)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        if time.monotonic() > deadline:
            sig = signal.SIGKILL
        time.sleep(0.1)
    for f in shm:
        with contextlib.suppress(OSError):
            os.unlink(f)
    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    return list(seen)


def spawn(parent: int, root: Path) -> subprocess.Popen[bytes]:
    """Start the supervisor of the cluster under ``root`` for driver ``parent`` (this process)."""
    pkg = str(Path(__file__).resolve().parents[2])  # the directory holding the cadenza package
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([pkg, *filter(None, [os.environ.get("PYTHONPATH")])])}
    with open(root / "reaper.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "cadenza.executor.reaper", "--parent", str(parent), "--root", str(root)],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # a kill of the driver's process group spares it
        )


def stop(proc: subprocess.Popen[bytes], *, keep: bool = False, timeout_s: float = 30.0) -> None:
    """Tell the supervisor to reap what is left and exit (the driver's clean shutdown)."""
    with contextlib.suppress(OSError, ValueError):
        assert proc.stdin is not None
        proc.stdin.write(b"keep\n" if keep else b"stop\n")
        proc.stdin.close()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def _supervise(parent: int, root: Path) -> int:
    """Wait for the driver to stop or die, then reap the cluster under ``root``."""
    go, keep = False, False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal go
        go = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the driver's to handle
    while not go and os.getppid() == parent:
        with contextlib.suppress(InterruptedError):
            ready, _, _ = select.select([sys.stdin], [], [], 0.2)
            if ready:  # "stop", "keep" or EOF (the driver is gone): reap
                keep = sys.stdin.readline().strip() == "keep"
                break
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    found = reap(root, exclude=(parent,), keep=keep)
    print(f"reaped {len(found)} process(es) of the cluster under {root}", flush=True)
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) != 4 or args[0] != "--parent" or args[2] != "--root":
        raise SystemExit("usage: python -m cadenza.executor.reaper --parent PID --root DIR")
    raise SystemExit(_supervise(int(args[1]), Path(args[3])))
