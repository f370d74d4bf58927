"""The two fork servers' program: stdlib only, run from this file with ``python -I -S``.

``exec`` mode is the persistent sandbox's exec server (:mod:`cadenza.sandbox.server`), running as a
child of bubblewrap's init with the file bound read-only inside; ``spawn`` mode is the host-side
spawner (:mod:`cadenza.sandbox.spawner`) that forks per-call sandboxes from inside their pids cgroup.
Both read one request per ``SOCK_SEQPACKET`` message with the output pipes attached (SCM_RIGHTS) and
answer ``{"pid"}`` then ``{"exit"}``. Importing this module does nothing; nothing from cadenza is
imported, because inside the sandbox cadenza is not on ``sys.path``.

    python -I -S forkserver.py exec FD SCRATCH_JSON
    python -I -S forkserver.py spawn FD
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable

PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 1, 4, 36


def serve(sock: socket.socket, handle: Callable[[dict, list[int]], None]) -> None:
    """Answer requests until the host closes its end; ``handle(request, fds)`` owns ``fds``."""
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 22, 2)
        except OSError:
            return
        if not msg:
            return
        handle(json.loads(msg), fds)


def _send(sock: socket.socket, obj: dict) -> None:
    sock.send(json.dumps(obj).encode())


# -- spawn mode: fork a command on the host, inside the cgroup this process joined --------------------------
def spawn_main(fd: int) -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # die with the parent
    if os.getppid() == 1:
        sys.exit(0)
    sock = socket.socket(fileno=fd)
    os.set_inheritable(sock.fileno(), False)

    def handle(req: dict, fds: list[int]) -> None:
        pid = os.fork()
        if pid == 0:
            try:
                for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores these; commands expect defaults
                    signal.signal(sig, signal.SIG_DFL)
                os.setsid()
                null = os.open("/dev/null", os.O_RDONLY)
                os.dup2(null, 0)
                os.dup2(fds[0], 1)
                os.dup2(fds[-1], 2)
                for f in {null, *fds} - {0, 1, 2}:
                    os.close(f)
                os.chdir(req["cwd"])
                os.execve(req["argv"][0], req["argv"], req["env"])
            except BaseException as exc:
                os.write(2, f"cannot start {req['argv'][0]}: {exc}\n".encode())
            os._exit(127)
        for f in fds:
            os.close(f)
        _send(sock, {"pid": pid})
        _, status = os.waitpid(pid, 0)
        _send(sock, {"exit": os.waitstatus_to_exitcode(status)})

    serve(sock, handle)


# -- exec mode: the persistent sandbox's server, inside bubblewrap's namespaces ------------------------------
def mounts() -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return sorted(line.split()[4] for line in f)


def keep_modes(scratch: list[str], mount_points: list[str]) -> dict[str, int]:
    """Scratch roots and the directories on the way to mount points below them (a workspace under
    ``/tmp``), with their modes: they are wiped around, never removed."""
    keep = {root: os.lstat(root).st_mode & 0o7777 for root in scratch if os.path.isdir(root)}
    for m in mount_points:
        for root in scratch:
            if m.startswith(root.rstrip("/") + "/"):
                parts = m[len(root) :].strip("/").split("/")
                for i in range(len(parts)):
                    p = os.path.join(root, *parts[: i + 1])
                    keep[p] = os.lstat(p).st_mode & 0o7777
    return keep


def kill_namespace(protected: set[int], cmd: int) -> int | None:
    """SIGKILL everything in the pid namespace but ``protected`` (init and us): the command and its
    background and ``setsid`` processes; reap them; return the command's wait status."""
    status = None
    while True:
        left = [int(n) for n in os.listdir("/proc") if n.isdigit() and int(n) not in protected]
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
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


def remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        os.chmod(path, 0o700)  # a command may have locked its own directories
        for e in os.scandir(path):
            remove(e.path)
        os.rmdir(path)
    else:
        os.unlink(path)


class InSandboxServer:
    """State of the exec server: its socket, the scratch roots it wipes, the mounts it must keep."""

    def __init__(self, sock: socket.socket, scratch: list[str]) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.sock = sock
        self.scratch = scratch
        self.protected = {1, os.getpid(), os.getppid()}
        self.mounts = mounts()
        self.keep = keep_modes(scratch, self.mounts)

    def wipe(self, root: str) -> None:
        os.chmod(root, self.keep[root])
        for e in list(os.scandir(root)):
            if e.path not in self.keep:
                remove(e.path)
            elif e.path not in self.mounts:
                self.wipe(e.path)

    def clean(self) -> None:
        """Empty the scratch roots and remove System V IPC objects: only workspace files outlive a call."""
        for root in self.scratch:
            if root in self.keep:
                self.wipe(root)
        for kind, ctl in (("shm", self.libc.shmctl), ("msg", self.libc.msgctl), ("sem", self.libc.semctl)):
            try:
                with open("/proc/sysvipc/" + kind) as f:
                    ids = [int(line.split()[1]) for line in f.read().splitlines()[1:]]
            except OSError:
                continue
            for ident in ids:
                ctl(ident, 0, 0) if kind == "sem" else ctl(ident, 0, None)  # IPC_RMID

    def handle(self, req: dict, fds: list[int]) -> None:
        if req.get("op") != "run":  # a kill that crossed the command's exit
            for fd in fds:
                os.close(fd)
            return
        self.run(req, fds)

    def run(self, req: dict, fds: list[int]) -> None:
        sock = self.sock
        try:
            proc = subprocess.Popen(
                req["argv"],
                stdin=subprocess.DEVNULL,
                stdout=fds[0],
                stderr=fds[-1],
                cwd=req["cwd"],
                env=req["env"],
                start_new_session=True,
                close_fds=True,
            )
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            os.write(fds[-1], f"cannot start {req['argv'][0]}: {exc}\n".encode(errors="replace"))
            for fd in fds:
                os.close(fd)
            _send(sock, {"pid": 0})
            _send(sock, {"exit": 127})
            return
        for fd in fds:
            os.close(fd)
        _send(sock, {"pid": proc.pid})
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
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        status = kill_namespace(self.protected, proc.pid)
        code = -signal.SIGKILL if status is None else os.waitstatus_to_exitcode(status)
        proc.returncode = code  # reaped here; keeps Popen from waiting on a recycled pid
        try:
            self.clean()
            intact = mounts() == self.mounts
        except Exception:
            intact = False
        _send(sock, {"exit": code})
        if not intact:
            sys.exit(0)  # state that cannot be put back: the host starts a fresh instance for the next call


def exec_main(fd: int, scratch: list[str]) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    libc.prctl(PR_SET_DUMPABLE, 0)  # no ptrace or /proc/<pid>/mem from commands
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans of a command come back to us
    if not hasattr(socket, "recv_fds"):
        sys.exit("the exec server needs python 3.9+")
    os.close(os.pidfd_open(os.getpid()))  # and Linux 5.3+: fails here, before "ready", if missing
    sock = socket.socket(fileno=fd)
    os.set_inheritable(sock.fileno(), False)
    os.chdir("/")
    server = InSandboxServer(sock, scratch)
    server.clean()
    _send(sock, {"ready": os.getpid()})
    serve(sock, server.handle)


def main(argv: list[str]) -> None:
    if argv[:1] == ["spawn"] and len(argv) == 2:
        spawn_main(int(argv[1]))
    elif argv[:1] == ["exec"] and len(argv) == 3:
        exec_main(int(argv[1]), json.loads(argv[2]))
    else:
        sys.exit("usage: forkserver.py spawn FD | exec FD SCRATCH_JSON")


if __name__ == "__main__":
    main(sys.argv[1:])
