"""Running one command and collecting its result: output pumping, deadline, tree kill, disk-quota watch.

Shared by every launch mode of :class:`~cadenza.sandbox.runner.Sandbox` (exec server, spawner, direct).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cadenza.sandbox.limits import PidsCgroup
from cadenza.sandbox.output import CappedBuffer

WATCH_S = 0.2  # how often a running command's watch (the disk quota) is checked


@dataclass(kw_only=True)
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool
    duration_s: float
    stdout_dropped: int = 0
    stderr_dropped: int = 0
    quota_exceeded: bool = False  # killed because the workspace outgrew the disk quota

    @property
    def output(self) -> str:
        """stdout then stderr, as an agent reads them."""
        if self.stdout and self.stderr:
            return self.stdout.rstrip("\n") + "\n" + self.stderr
        return self.stdout or self.stderr


@dataclass
class Handle:
    pid: int
    wait: Callable[[float | None], int | None]
    kill: Callable[[], None]  # the command's whole tree, background processes included


def wait_popen(proc: subprocess.Popen, deadline: float | None) -> int | None:
    try:
        return proc.wait(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return None


def popen_launcher(
    argv: list[str], env: dict[str, str], cwd: str, preexec: Callable[[], None], cgroup: PidsCgroup | None
) -> Callable[[list[int]], Handle]:
    """Start ``argv`` directly in a session of its own, ``preexec`` (rlimits, joining ``cgroup``) run
    between fork and exec; its kill takes the process group and every member of ``cgroup``."""

    def launch(fds: list[int]) -> Handle:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=fds[0],
            stderr=fds[-1],
            cwd=cwd,
            env=env,
            start_new_session=True,
            preexec_fn=preexec,
            close_fds=True,
        )
        return Handle(
            proc.pid, lambda deadline: wait_popen(proc, deadline), lambda: kill_tree(proc.pid, cgroup)
        )

    return launch


def kill_tree(pid: int, cgroup: PidsCgroup | None = None, spare: int | None = None) -> None:
    """Kill a process tree: the process group led by ``pid`` (every process cadenza starts leads its own
    session) and, with a cgroup, every other member but ``spare``, waiting until they are gone.

    The one tree-kill helper: sandbox calls, the exec server's instance, host test runs.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    if cgroup is not None:
        cgroup.kill_all(spare=spare, wait_s=5.0)


def disk_usage(root: Path) -> int:
    """Bytes allocated under ``root`` (files and directories, never following symlinks)."""
    total, stack = 0, [str(root)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            total += st.st_blocks * 512
            if e.is_dir(follow_symlinks=False):
                stack.append(e.path)
    return total


def execute(
    launch,
    *,
    timeout_s: float,
    cap: int,
    merge_stderr: bool,
    watch: Callable[[], str | None] | None = None,
) -> ExecResult:
    """Start ``launch(fds)``, pump its output until EOF or the deadline, kill its tree, collect the result.

    ``watch`` is polled every :data:`WATCH_S` seconds while the command runs; when it returns a reason,
    the command's tree is killed and the reason is appended to its stderr (e.g. the disk quota).
    """
    start = time.monotonic()
    r_out, w_out = os.pipe()
    readers, writers = [r_out], [w_out]
    if not merge_stderr:
        r_err, w_err = os.pipe()
        readers.append(r_err)
        writers.append(w_err)
    try:
        handle = launch(writers)
    except OSError as exc:
        for fd in readers:
            os.close(fd)
        return ExecResult(
            exit_code=127,
            stdout="",
            stderr=f"cannot start the command: {exc}",
            timed_out=False,
            duration_s=time.monotonic() - start,
        )
    finally:
        for fd in writers:
            os.close(fd)
    buffers = {fd: CappedBuffer(cap) for fd in readers}  # insertion order: stdout, stderr
    deadline = start + timeout_s
    code: int | None = None
    timed_out = True
    stopped: str | None = None
    with selectors.DefaultSelector() as sel:
        for fd in readers:
            sel.register(fd, selectors.EVENT_READ)
        try:
            state = _pump(sel, buffers, deadline, watch)
            if state == "eof":
                code = handle.wait(deadline)
                timed_out = code is None
            elif state != "deadline":
                stopped, timed_out = state, False
        except OSError:  # the spawner died under us: report the command as killed
            timed_out = False
        finally:
            handle.kill()
            if code is None:
                with contextlib.suppress(OSError):
                    code = handle.wait(None)
            _pump(sel, buffers, time.monotonic() + 0.5, None)  # whatever was written before the kill
            for fd in readers:
                os.close(fd)
    out, err = [*buffers.values(), None][:2]
    if stopped is not None:
        (err or out).feed(f"\n[{stopped}: every process of the command was killed]\n".encode())
    return ExecResult(
        exit_code=code if code is not None else -signal.SIGKILL,
        stdout=out.text(),
        stderr=err.text() if err else "",
        timed_out=timed_out,
        duration_s=time.monotonic() - start,
        stdout_dropped=out.dropped,
        stderr_dropped=err.dropped if err else 0,
        quota_exceeded=stopped is not None,
    )


def _pump(
    sel: selectors.BaseSelector,
    buffers: dict[int, CappedBuffer],
    deadline: float,
    watch: Callable[[], str | None] | None,
) -> str:
    """Read until every stream is at EOF (``"eof"``), the deadline passes (``"deadline"``) or ``watch``
    gives a reason to stop (that reason)."""
    next_watch = time.monotonic() + WATCH_S
    while sel.get_map():
        now = time.monotonic()
        remaining = deadline - now
        if remaining <= 0:
            return "deadline"
        if watch is not None and now >= next_watch:
            reason = watch()
            if reason:
                return reason
            next_watch = now + WATCH_S
        for key, _ in sel.select(min(remaining, WATCH_S) if watch is not None else remaining):
            try:
                data = os.read(key.fd, 1 << 16)
            except OSError:
                data = b""
            if data:
                buffers[key.fd].feed(data)
            else:
                sel.unregister(key.fd)
    return "eof"


def either(
    a: Callable[[], str | None] | None, b: Callable[[], str | None] | None
) -> Callable[[], str | None] | None:
    """One watch that stops for either reason."""
    if a is None or b is None:
        return a or b
    return lambda: a() or b()
