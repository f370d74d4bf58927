"""A persistent sandbox: one bubblewrap instance per episode with a tiny exec server inside.

Starting bubblewrap costs 5-25 ms (namespaces, mounts), more than a tool call may spend. So an episode
starts one ``bwrap`` (same binds, namespaces, pids cgroup and limits as a per-call run) whose program is
a stdlib-only server talking over a ``SOCK_SEQPACKET`` socket pair inherited through bwrap. Each call is
forked by the server with its own session, rlimits and closed stdin; the host passes the output pipes
(SCM_RIGHTS) and keeps the wall-clock deadline. When the command exits or is killed, the server kills
every other process in the pid namespace (background and ``setsid`` ones included, as the namespace's
end does per call), reaps them, and wipes the private ``/tmp``, ``/dev/shm``, ``HOME`` and System V IPC,
so only workspace files outlive a call. ``/dev`` is read-only. The server makes itself non-dumpable so
commands cannot ptrace or read it; a command that kills it anyway only ends its own sandbox: the host
sees the socket close, kills the whole instance, and the next call starts a fresh one.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from cadenza.sandbox.config import SandboxConfig
from cadenza.sandbox.limits import PidsCgroup, make_preexec

START_TIMEOUT_S = 30.0
KILL_REPLY_TIMEOUT_S = 5.0  # a server that does not answer a kill within this is declared dead

_SCRIPT = r"""
import ctypes, json, os, select, signal, socket, subprocess, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
libc.prctl(4, 0)               # PR_SET_DUMPABLE 0: no ptrace or /proc/<pid>/mem from commands
libc.prctl(36, 1)              # PR_SET_CHILD_SUBREAPER: orphans of a command come back to us
if not hasattr(socket, "recv_fds"):
    sys.exit("the exec server needs python 3.9+")
os.close(os.pidfd_open(os.getpid()))  # and Linux 5.3+: fails here, before "ready", if missing
sock = socket.socket(fileno=int(sys.argv[1]))
os.set_inheritable(sock.fileno(), False)
SCRATCH = json.loads(sys.argv[2])
PROTECTED = {1, os.getpid(), os.getppid()}
os.chdir("/")

def mounts():
    with open("/proc/self/mountinfo") as f:
        return sorted(line.split()[4] for line in f)

MOUNTS = mounts()
# scratch directories that hold mount points (the workspace under /tmp): wiped around them, modes restored
KEEP = {root: os.lstat(root).st_mode & 0o7777 for root in SCRATCH if os.path.isdir(root)}
for m in MOUNTS:
    for root in SCRATCH:
        if m.startswith(root.rstrip("/") + "/"):
            parts = m[len(root):].strip("/").split("/")
            for i in range(len(parts)):
                p = os.path.join(root, *parts[:i + 1])
                KEEP[p] = os.lstat(p).st_mode & 0o7777

def kill_all(cmd):
    # Everything in the namespace but init and us: the command, its background and setsid'd processes.
    status = None
    while True:
        left = [int(n) for n in os.listdir("/proc") if n.isdigit() and int(n) not in PROTECTED]
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        while True:
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid == cmd:
                status = st
        if not left:
            return status
        time.sleep(0.0005)

def remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        os.chmod(path, 0o700)  # a command may have locked its own directories
        for e in os.scandir(path):
            remove(e.path)
        os.rmdir(path)
    else:
        os.unlink(path)

def wipe(root):
    os.chmod(root, KEEP[root])
    for e in list(os.scandir(root)):
        if e.path not in KEEP:
            remove(e.path)
        elif e.path not in MOUNTS:
            wipe(e.path)

def clean():
    for root in SCRATCH:
        if root in KEEP:
            wipe(root)
    for kind, ctl in (("shm", libc.shmctl), ("msg", libc.msgctl), ("sem", libc.semctl)):
        try:
            with open("/proc/sysvipc/" + kind) as f:
                ids = [int(line.split()[1]) for line in f.read().splitlines()[1:]]
        except OSError:
            continue
        for ident in ids:
            ctl(ident, 0, 0) if kind == "sem" else ctl(ident, 0, None)  # IPC_RMID

def run(req, fds):
    try:
        proc = subprocess.Popen(req["argv"], stdin=subprocess.DEVNULL, stdout=fds[0], stderr=fds[-1],
                                cwd=req["cwd"], env=req["env"], start_new_session=True, close_fds=True)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        os.write(fds[-1], ("cannot start %s: %s\n" % (req["argv"][0], exc)).encode(errors="replace"))
        for fd in fds:
            os.close(fd)
        sock.send(json.dumps({"pid": 0}).encode())
        sock.send(json.dumps({"exit": 127}).encode())
        return
    for fd in fds:
        os.close(fd)
    sock.send(json.dumps({"pid": proc.pid}).encode())
    pidfd = os.pidfd_open(proc.pid)
    while True:
        ready, _, _ = select.select([pidfd, sock], [], [])
        if pidfd in ready:
            break
        msg = sock.recv(1 << 16)
        if not msg:
            sys.exit(0)  # the host is gone: dying takes the namespace with us
        if json.loads(msg).get("op") == "kill":
            break
    os.close(pidfd)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    status = kill_all(proc.pid)
    code = -signal.SIGKILL if status is None else os.waitstatus_to_exitcode(status)
    proc.returncode = code  # reaped here; keeps Popen from waiting on a recycled pid
    try:
        clean()
        intact = mounts() == MOUNTS
    except Exception:
        intact = False
    sock.send(json.dumps({"exit": code}).encode())
    if not intact:
        sys.exit(0)  # state that cannot be put back: the host starts a fresh instance for the next call

clean()
sock.send(json.dumps({"ready": os.getpid()}).encode())
while True:
    try:
        msg, fds, _, _ = socket.recv_fds(sock, 1 << 22, 2)
    except OSError:
        break
    if not msg:
        break
    req = json.loads(msg)
    if req.get("op") != "run":  # a kill that crossed the command's exit
        for fd in fds:
            os.close(fd)
        continue
    run(req, fds)
"""


class ServerDied(OSError):
    """The exec server stopped answering; its sandbox instance is torn down and restarted next call."""


class ExecServer:
    """One bubblewrap instance with the exec server inside; one command at a time."""

    def __init__(
        self, bwrap_prefix: list[str], *, python: str, config: SandboxConfig, cgroup_root: Path | None
    ) -> None:
        self.cgroup: PidsCgroup | None = PidsCgroup(cgroup_root, config.max_procs) if cgroup_root else None
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        scratch = json.dumps(["/tmp", "/dev/shm", config.home])
        argv = [
            *bwrap_prefix,
            "--remount-ro",
            "/dev",
            "--clearenv",
            "--setenv",
            "PATH",
            "/usr/bin:/bin",
            "--chdir",
            "/",
            "--",
            python,
            "-I",
            "-S",
            "-c",
            _SCRIPT,
            str(child.fileno()),
            scratch,
        ]
        self.sock = parent
        self.broken = False
        try:
            self.proc = subprocess.Popen(
                argv,
                pass_fds=[child.fileno()],
                preexec_fn=make_preexec(config, self.cgroup),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env={"PATH": "/usr/bin:/bin"},
                cwd="/",
                start_new_session=True,
            )
        except BaseException:
            child.close()
            self.close()
            raise
        child.close()
        try:
            ready = self._recv(time.monotonic() + START_TIMEOUT_S)
        except ServerDied:
            ready = None
        if not ready or "ready" not in ready:
            err = b""
            with contextlib.suppress(Exception):
                self.close()
                err = self.proc.stderr.read() if self.proc.stderr else b""
            tail = (err.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
            raise ServerDied(f"the sandbox exec server did not start ({tail})")
        if self.proc.stderr is not None:
            self.proc.stderr.close()

    def alive(self) -> bool:
        return not self.broken and self.proc.poll() is None

    def spawn(
        self, argv: list[str], *, env: dict[str, str], cwd: str, fds: list[int]
    ) -> tuple[int, Callable[[float | None], int | None], Callable[[], None]]:
        """Start ``argv`` inside; return (pid in the sandbox, wait(deadline) -> exit code, kill()).

        The rlimits were set on the server when it started (same values as a per-call run) and each
        command inherits them with fresh counters (CPU seconds are per process).
        """
        req = {"op": "run", "argv": argv, "env": env, "cwd": cwd}
        try:
            socket.send_fds(self.sock, [json.dumps(req).encode()], fds)
        except OSError as exc:
            if exc.errno == errno.EMSGSIZE:  # the request, not the server: it keeps running
                raise OSError(f"command and environment too large ({exc.strerror})") from None
            self._die()
            raise ServerDied(f"the sandbox exec server died ({exc})") from None
        reply = self._recv(time.monotonic() + START_TIMEOUT_S)
        if reply is None or "pid" not in reply:
            self._die()
            raise ServerDied("the sandbox exec server did not start the command")
        state: dict[str, int | None] = {"exit": None}
        done = [False]

        def wait(deadline: float | None) -> int | None:
            if done[0]:
                return state["exit"]
            reply = self._recv(deadline if deadline is not None else time.monotonic() + KILL_REPLY_TIMEOUT_S)
            if reply is None:
                if deadline is None:
                    self._die()
                    raise ServerDied("the sandbox exec server did not answer a kill")
                return None
            done[0] = True
            state["exit"] = int(reply["exit"])
            return state["exit"]

        def kill() -> None:
            if done[0] or self.broken:
                return
            try:
                self.sock.send(json.dumps({"op": "kill"}).encode())
            except OSError:
                self._die()

        return int(reply["pid"]), wait, kill

    def _recv(self, deadline: float) -> dict | None:
        ready, _, _ = select.select([self.sock], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return None
        try:
            data = self.sock.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            self._die()
            raise ServerDied("the sandbox exec server died")
        return json.loads(data)

    def _die(self) -> None:
        """Tear the whole instance down (bwrap, its namespace, anything left in the cgroup)."""
        self.broken = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=5)
        if self.cgroup is not None:
            self.cgroup.kill_all(wait_s=5.0)

    def close(self) -> None:
        """Stop the instance and remove its cgroup; idempotent."""
        with contextlib.suppress(OSError):
            self.sock.close()
        if hasattr(self, "proc"):
            self._die()
        if self.cgroup is not None:
            self.cgroup.kill_all_and_remove()
            self.cgroup = None
