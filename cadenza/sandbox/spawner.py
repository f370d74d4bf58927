"""A small long-lived process that forks the sandbox's commands from inside their pids cgroup.

Moving a process into a cgroup waits for an RCU grace period (5-10 ms), more than bubblewrap itself
costs. So each :class:`~cadenza.sandbox.runner.Sandbox` with a pids cgroup starts one spawner that
joins the cgroup once (and takes the rlimits); every command is forked from it and is born inside.
The parent passes the output pipes over a unix socket (SCM_RIGHTS) and kills by process group. The
program is :mod:`cadenza.sandbox.forkserver` in ``spawn`` mode, run from its file.
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

from cadenza.sandbox import forkserver


class Spawner:
    def __init__(self, preexec: Callable[[], None]) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", forkserver.__file__, "spawn", str(child.fileno())],
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
