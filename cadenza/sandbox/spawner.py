"""A small long-lived process that forks the sandbox's commands from inside their pids cgroup.

Moving a process into a cgroup waits for an RCU grace period (5-10 ms), more than bubblewrap itself
costs. So each :class:`~cadenza.sandbox.runner.Sandbox` with a pids cgroup starts one spawner that
joins the cgroup once (and takes the rlimits); every command is forked from it and is born inside.
The parent passes the output pipes over a unix socket (SCM_RIGHTS) and kills by process group.
"""

from __future__ import annotations

import json
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

_SCRIPT = r"""
import ctypes, json, os, signal, socket, sys
try:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the parent
except Exception:
    pass
if os.getppid() == 1:
    sys.exit(0)
sock = socket.socket(fileno=int(sys.argv[1]))
os.set_inheritable(sock.fileno(), False)
while True:
    try:
        msg, fds, _, _ = socket.recv_fds(sock, 1 << 22, 2)
    except OSError:
        break
    if not msg:
        break
    req = json.loads(msg)
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
            for fd in {null, *fds} - {0, 1, 2}:
                os.close(fd)
            os.chdir(req["cwd"])
            os.execve(req["argv"][0], req["argv"], req["env"])
        except BaseException as exc:
            os.write(2, ("cannot start %s: %s\n" % (req["argv"][0], exc)).encode())
        os._exit(127)
    for fd in fds:
        os.close(fd)
    sock.send(json.dumps({"pid": pid}).encode())
    _, status = os.waitpid(pid, 0)
    sock.send(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode())
"""


class Spawner:
    def __init__(self, preexec: Callable[[], None]) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _SCRIPT, str(child.fileno())],
            pass_fds=[child.fileno()],
            preexec_fn=preexec,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        child.close()
        self.sock = parent
        self.lock = threading.Lock()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def spawn(self, argv: list[str], env: dict[str, str], cwd: str, fds: list[int]) -> int:
        """Start ``argv`` (argv[0] an absolute path) with stdout/stderr on ``fds``; return its pid."""
        socket.send_fds(self.sock, [json.dumps({"argv": argv, "env": env, "cwd": cwd}).encode()], fds)
        reply = self._recv(None)
        if reply is None or "pid" not in reply:
            raise OSError("the sandbox spawner died")
        return int(reply["pid"])

    def wait(self, deadline: float | None) -> int | None:
        """The exit code of the last spawned command, or None if the deadline passes first."""
        reply = self._recv(deadline)
        if reply is None:
            return None
        return int(reply["exit"])

    def _recv(self, deadline: float | None) -> dict | None:
        if deadline is not None:
            ready, _, _ = select.select([self.sock], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return None
        data = self.sock.recv(65536)
        if not data:
            raise OSError("the sandbox spawner died")
        return json.loads(data)

    def close(self) -> None:
        self.sock.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
