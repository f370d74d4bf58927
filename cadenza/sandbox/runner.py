"""Run commands under bubblewrap with limits, a wall-clock timeout and capped output.

The ``bwrap`` line: new pid/net/ipc/uts namespaces, all capabilities dropped, the allowlist of
read-only binds from :mod:`cadenza.sandbox.binds`, the workspace read-write at its own path, private
``/tmp``, ``/dev``, ``/proc`` and a tmpfs ``HOME``. Per-call mode runs one ``bwrap`` per command; killing
it kills the sandbox's pid 1 (``--die-with-parent``), which takes the whole namespace with it.
Persistent mode (the default) runs every command of a :class:`Sandbox` through one such instance and
its exec server (:mod:`cadenza.sandbox.server`), which gives each call the same clean slate.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import threading
import weakref
from collections.abc import Callable
from pathlib import Path

from cadenza.errors import SandboxError
from cadenza.pathrel import is_within_real
from cadenza.sandbox.binds import SYSTEM_PATHS, BindPlan, plan_binds
from cadenza.sandbox.config import SandboxConfig
from cadenza.sandbox.envinfo import EnvInfo, env_info
from cadenza.sandbox.execute import ExecResult, Handle, disk_usage, either, execute, kill_tree, popen_launcher
from cadenza.sandbox.limits import PidsCgroup, make_preexec, pids_cgroup_root
from cadenza.sandbox.server import ExecServer, ServerDied, program_bind
from cadenza.sandbox.spawner import Spawner

INSTALL_HINT = (
    "install it with 'apt-get install bubblewrap' (or pass --no-sandbox for trusted debugging only)"
)


@functools.lru_cache(maxsize=1)
def bwrap_path() -> str:
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxError(f"bubblewrap (bwrap) is not installed; {INSTALL_HINT}")
    return path


class Sandbox:
    """Runs commands for one workspace. Build once per episode.

    With ``config.persistent`` (the default) calls go to one bubblewrap instance started on the first call
    (restarted if it dies); otherwise every ``run`` starts its own bubblewrap. Both give each call the same
    limits, timeout, output cap and a clean slate apart from workspace files.
    """

    def __init__(
        self,
        workspace: str | os.PathLike[str],
        *,
        env_dir: str | os.PathLike[str] | None = None,
        config: SandboxConfig | None = None,
        hidden: list[Path] | None = None,
        path_map: dict[Path, Path] | None = None,
        rw_extra: list[Path] | None = None,
        single_call: bool = False,
    ) -> None:
        self.workspace = Path(workspace).absolute()
        # per-call mode, one command expected (grading's runs): the command joins the pids cgroup itself
        # rather than through a spawner, whose interpreter start would cost more than the join it saves
        self.single_call = single_call
        if not self.workspace.is_dir():
            raise SandboxError(f"workspace {self.workspace} does not exist")
        self.config = config or SandboxConfig()
        self.env: EnvInfo | None = env_info(env_dir) if env_dir is not None else None
        for h in hidden or []:
            if is_within_real(self.workspace, h):
                raise SandboxError(
                    f"workspace {self.workspace} lies inside hidden directory {h}; copy it elsewhere first"
                )
        self.plan: BindPlan = plan_binds(
            workspace=self.workspace,
            env=self.env,
            hidden=list(hidden or []),
            path_map=path_map,
            rw_extra=rw_extra,
            ro_extra=self.config.extra_ro_binds,
        )
        self._cgroup_root = pids_cgroup_root()
        self._cgroup: PidsCgroup | None = None
        self._spawner: Spawner | None = None
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _cleanup, [])
        self._server: ExecServer | None = None
        self._server_finalizer = weakref.finalize(self, _cleanup, [])
        self._persistent_failed = False
        self._quota_limit: int | None = None  # measured once, on the first call
        if not self.config.no_sandbox:
            self._prefix = self._bwrap_prefix()
            _check_bwrap(self._prefix[0], tuple(self._system_args()))

    @property
    def sandboxed(self) -> bool:
        return not self.config.no_sandbox

    @property
    def process_limit_enforced(self) -> bool:
        """Whether a fork bomb is capped: a pids cgroup, or RLIMIT_NPROC for a non-root caller."""
        return self._cgroup_root is not None or os.geteuid() != 0

    def environment(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        path = ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
        env = {
            "HOME": self.config.home,
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "TMPDIR": "/tmp",
            "USER": "agent",
            "PIP_NO_INDEX": "1",
            "PIP_NO_CACHE_DIR": "1",
        }
        if self.env is not None:
            path.insert(0, str(Path(self.env.env_dir) / "bin"))
            env["VIRTUAL_ENV"] = self.env.env_dir
        if self.plan.pythonpath:
            env["PYTHONPATH"] = os.pathsep.join(self.plan.pythonpath)
        env["PATH"] = os.pathsep.join(path)
        env.update(extra or {})
        return env

    def _bwrap_prefix(self, extra: list[str] | None = None) -> list[str]:
        """The bwrap options of every call; ``extra`` binds go in before the root is made read-only."""
        cfg = self.config
        argv = [
            bwrap_path(),
            "--die-with-parent",
            "--new-session",
            *([] if cfg.network else ["--unshare-net"]),
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--hostname",
            "sandbox",
        ]
        if os.geteuid() == 0:
            argv += ["--cap-drop", "ALL"]
        # /proc/sys read-only: uid 0 without capabilities still owns (and could write) global sysctls
        argv += [
            "--proc",
            "/proc",
            "--ro-bind",
            "/proc/sys",
            "/proc/sys",
            "--ro-bind-try",
            "/proc/sysrq-trigger",
            "/proc/sysrq-trigger",
            "--dev",
            "/dev",
            "--size",
            str(cfg.tmpfs_bytes),
            "--tmpfs",
            "/dev/shm",
            "--size",
            str(cfg.tmpfs_bytes),
            "--tmpfs",
            "/tmp",
            "--size",
            str(cfg.tmpfs_bytes),
            "--tmpfs",
            cfg.home,
        ]
        argv += self._system_args()
        for p in self.plan.ro:
            if p not in SYSTEM_PATHS:
                argv += ["--ro-bind", p, p]
        for p in self.plan.rw:
            argv += ["--bind", p, p]
        argv += [*(extra or []), "--remount-ro", "/"]
        return argv

    def _system_args(self) -> list[str]:
        argv: list[str] = []
        for target, link in self.plan.symlinks:
            argv += ["--symlink", target, link]
        for p in self.plan.ro:
            if p in SYSTEM_PATHS:
                argv += ["--ro-bind", p, p]
        return argv

    def argv(
        self, command: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None
    ) -> list[str]:
        """The full ``bwrap`` command line for ``command`` (for inspection and benchmarks)."""
        full = [*self._prefix, "--clearenv"]
        for k, v in self.environment(env).items():
            full += ["--setenv", k, v]
        full += ["--chdir", str(cwd or self.workspace), "--", *command]
        return full

    def run(
        self,
        command: list[str] | str,
        *,
        timeout_s: float | None = None,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        merge_stderr: bool = False,
        stop: Callable[[], str | None] | None = None,
    ) -> ExecResult:
        """Run ``command`` (argv, or a string for ``bash -c``); never raises for what the command does.

        ``stop`` is polled while it runs (as the disk quota is); a reason it returns kills the command."""
        if isinstance(command, str):
            command = ["bash", "-c", command]
        timeout = self.config.timeout_s if timeout_s is None else timeout_s
        if self.config.no_sandbox:
            argv, popen_env, popen_cwd = command, self.environment(env), str(cwd or self.workspace)
        else:
            argv, popen_env, popen_cwd = self.argv(command, cwd=cwd, env=env), {"PATH": "/usr/bin:/bin"}, "/"
        with self._lock:
            server = self._live_server()
            if server is not None:
                launch = self._server_launcher(
                    server, command, env=self.environment(env), cwd=str(cwd or self.workspace)
                )
            else:
                launch = self._launcher(argv, popen_env, popen_cwd)
            return execute(
                launch,
                timeout_s=timeout,
                cap=self.config.max_output_bytes,
                merge_stderr=merge_stderr,
                watch=either(self._quota_watch(), stop),
            )

    def _quota_watch(self) -> Callable[[], str | None] | None:
        """Stops a command once the workspace has grown past ``disk_quota_bytes`` during it.

        Nothing is measured for commands shorter than one watch interval (most calls). A workspace that
        was over the quota when the sandbox was made (a big repository) is held to that size instead.
        """
        quota = self.config.disk_quota_bytes
        if quota is None:
            return None
        if self._quota_limit is None:
            self._quota_limit = max(quota, disk_usage(self.workspace))
        root, limit = self.workspace, self._quota_limit

        def watch() -> str | None:
            used = disk_usage(root)
            if used > limit:
                return (
                    f"disk quota exceeded: the workspace holds {used >> 20} MiB, the limit is "
                    f"{limit >> 20} MiB"
                )
            return None

        return watch

    @property
    def persistent(self) -> bool:
        """Whether calls go to one long-lived sandbox instance (see :mod:`cadenza.sandbox.server`)."""
        return self.config.persistent and not self.config.no_sandbox and not self._persistent_failed

    def _live_server(self) -> ExecServer | None:
        """The running exec server, started (or restarted after it died) on demand; None for per-call mode."""
        if not self.persistent:
            return None
        if self._server is not None and self._server.alive():
            return self._server
        self._server_finalizer()  # the dead one, if any: its bwrap, namespace and cgroup
        self._server = None
        for python in self._server_pythons():
            try:
                self._server = ExecServer(
                    self._bwrap_prefix(program_bind()),
                    python=python,
                    config=self.config,
                    cgroup_root=self._cgroup_root,
                )
                break
            except (OSError, subprocess.SubprocessError):
                continue
        if self._server is None:
            # no usable interpreter inside, or a cgroup that refuses members: per-call mode still works
            self._persistent_failed = True
            return None
        self._server_finalizer = weakref.finalize(self, _cleanup, [self._server])
        self._cgroup = self._server.cgroup
        return self._server

    def _server_pythons(self) -> list[str]:
        """Interpreters visible inside the sandbox for the exec server: the system one, the task env's."""
        found = [p for p in ("/usr/bin/python3",) if os.path.exists(p)]
        return [*found, self.env.python] if self.env is not None else found

    def _server_launcher(
        self, server: ExecServer, command: list[str], *, env: dict[str, str], cwd: str
    ) -> Callable[[list[int]], Handle]:
        def launch(fds: list[int]) -> Handle:
            try:
                return Handle(*server.spawn(command, env=env, cwd=cwd, fds=fds))
            except ServerDied:  # it died between calls and the command never started: once more, fresh
                fresh = self._live_server()
                if fresh is None:
                    raise
                return Handle(*fresh.spawn(command, env=env, cwd=cwd, fds=fds))

        return launch

    def _launcher(self, argv: list[str], env: dict[str, str], cwd: str) -> Callable[[list[int]], Handle]:
        """How to start one command: through the cgroup's spawner when there is a cgroup, else directly."""
        if self._spawner is not None and self._spawner.proc.poll() is not None:  # it died (OOM killer, ...)
            self._finalizer()
            self._spawner = None
        if self.single_call and self._cgroup_root is not None:
            return self._joining_launcher(argv, env, cwd)
        if self._cgroup_root is not None and self._spawner is None:
            try:
                self._cgroup = PidsCgroup(self._cgroup_root, self.config.max_procs)
                self._spawner = Spawner(make_preexec(self.config, self._cgroup))
                self._finalizer.detach()
                self._finalizer = weakref.finalize(self, _cleanup, [self._spawner, self._cgroup])
            except (OSError, subprocess.SubprocessError):  # e.g. a cgroup v2 parent that refuses members
                if self._cgroup is not None:
                    self._cgroup.kill_all_and_remove()
                self._cgroup_root = self._cgroup = None
        if self._spawner is not None:
            spawner, cgroup = self._spawner, self._cgroup
            exe = (
                argv[0] if os.path.isabs(argv[0]) else shutil.which(argv[0], path=env.get("PATH")) or argv[0]
            )

            def spawned(fds: list[int]) -> Handle:
                pid = spawner.spawn([exe, *argv[1:]], env, cwd, fds)
                return Handle(pid, spawner.wait, lambda: kill_tree(pid, cgroup, spawner.pid))

            return spawned

        return popen_launcher(argv, env, cwd, make_preexec(self.config, None), None)

    def _joining_launcher(
        self, argv: list[str], env: dict[str, str], cwd: str
    ) -> Callable[[list[int]], Handle]:
        """Start the command directly; it joins this sandbox's pids cgroup between fork and exec."""
        if self._cgroup is None:
            try:
                self._cgroup = PidsCgroup(self._cgroup_root, self.config.max_procs)
            except OSError:  # a cgroup parent that refuses members: RLIMIT_NPROC only, as without one
                self._cgroup_root = None
                return self._launcher(argv, env, cwd)
            self._finalizer.detach()
            self._finalizer = weakref.finalize(self, _cleanup, [self._cgroup])
        joined = popen_launcher(argv, env, cwd, make_preexec(self.config, self._cgroup), self._cgroup)

        def launch(fds: list[int]) -> Handle:
            try:
                return joined(fds)
            except subprocess.SubprocessError:  # the cgroup refused the member: as the spawner's fallback
                self._finalizer()
                self._cgroup_root = self._cgroup = None
                return self._launcher(argv, env, cwd)(fds)

        return launch

    def close(self) -> None:
        """Stop this sandbox's exec server or spawner and remove its cgroup (also done when
        garbage-collected)."""
        self._server_finalizer()
        self._server = None
        self._finalizer()


def _cleanup(resources: list) -> None:
    for r in resources:
        if isinstance(r, (Spawner, ExecServer)):
            r.close()
        elif isinstance(r, PidsCgroup):
            r.kill_all_and_remove()


@functools.lru_cache(maxsize=4)
def _check_bwrap(bwrap: str, system_args: tuple[str, ...]) -> None:
    """One probe per process: bwrap may be installed but unable to create namespaces."""
    probe = [bwrap, "--unshare-pid", "--unshare-net", *system_args, "--", "true"]
    try:
        out = subprocess.run(probe, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxError(f"bubblewrap cannot start ({exc}); {INSTALL_HINT}") from None
    if out.returncode != 0:
        msg = (out.stderr.strip().splitlines() or ["unknown error"])[-1]
        raise SandboxError(
            f"bubblewrap cannot create namespaces here ({msg}); allow unprivileged user namespaces or run "
            "as root"
        )
