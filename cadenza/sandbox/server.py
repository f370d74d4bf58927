"""A persistent sandbox: one bubblewrap instance per episode with a tiny exec server inside.

Starting bubblewrap costs 5-25 ms (namespaces, mounts), more than a tool call may spend. So an episode
starts one ``bwrap`` (same binds, namespaces, pids cgroup and limits as a per-call run) whose program is
a stdlib-only server (:mod:`cadenza.sandbox.forkserver`, run from its file) talking over a
``SOCK_SEQPACKET`` socket pair inherited through bwrap. Each call is forked by the server with its own
session, rlimits and closed stdin; the host passes the output pipes (SCM_RIGHTS) and keeps the
wall-clock deadline. When the command exits or is killed, the server kills every other process in the pid
namespace (background and ``setsid`` ones included, as the namespace's end does per call), reaps them,
and wipes the private ``/tmp``, ``/dev/shm``, ``HOME`` and System V IPC, so only workspace files outlive
a call. ``/dev`` is read-only. The server makes itself non-dumpable so commands cannot ptrace or read
it; a command that kills it anyway only ends its own sandbox: the host sees the socket close, kills the
whole instance, and the next call starts a fresh one.
"""

from __future__ import annotations

import contextlib
import errno
import json
import select
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from cadenza.sandbox import forkserver
from cadenza.sandbox.config import SandboxConfig
from cadenza.sandbox.execute import kill_tree
from cadenza.sandbox.limits import PidsCgroup, make_preexec

START_TIMEOUT_S = 30.0
KILL_REPLY_TIMEOUT_S = 5.0  # a server that does not answer a kill within this is declared dead

#: Where the exec server's program (:mod:`cadenza.sandbox.forkserver`) is bound inside the sandbox.
PROGRAM_INSIDE = "/run/cadenza/forkserver.py"


def program_bind() -> list[str]:
    """bubblewrap arguments that make the program file visible (read-only) to the exec server."""
    return ["--ro-bind", forkserver.__file__, PROGRAM_INSIDE]


class ServerDied(OSError):
    """The exec server stopped answering; its sandbox instance is torn down and restarted next call."""


class ExecServer:
    """One bubblewrap instance with the exec server inside; one command at a time."""

    def __init__(
        self, bwrap_prefix: list[str], *, python: str, config: SandboxConfig, cgroup_root: Path | None
    ) -> None:
        """``bwrap_prefix`` must include :func:`program_bind` (before the root is remounted read-only)."""
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
            PROGRAM_INSIDE,
            "exec",
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
        kill_tree(self.proc.pid, self.cgroup, None)
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=5)

    def close(self) -> None:
        """Stop the instance and remove its cgroup; idempotent."""
        with contextlib.suppress(OSError):
            self.sock.close()
        if hasattr(self, "proc"):
            self._die()
        if self.cgroup is not None:
            self.cgroup.kill_all_and_remove()
            self.cgroup = None
