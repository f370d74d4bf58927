"""Sandbox configuration: resource limits and isolation switches, one dataclass."""

from __future__ import annotations

from dataclasses import dataclass, field

from cadenza.errors import ConfigError

GiB = 1 << 30
MiB = 1 << 20


@dataclass(kw_only=True)
class SandboxConfig:
    """Limits applied to every command run in the sandbox.

    ``timeout_s`` is the default wall-clock limit of one call (the whole process tree is killed when it
    passes); ``cpu_s``/``memory_bytes``/``max_procs``/``max_file_bytes`` are kernel limits (rlimits; the
    process count also through a pids cgroup when one is writable, because root ignores RLIMIT_NPROC).
    ``max_output_bytes`` caps each captured stream (head and tail kept). ``no_sandbox`` runs commands
    as plain subprocesses (limits still applied) for trusted debugging only; episodes record it.
    ``disk_quota_bytes`` caps the workspace's size (default 1 GiB; ``None`` turns it off): a command that
    grows it past the limit is killed (checked every 0.2 s; each file is also capped by
    ``max_file_bytes``, so one write cannot run far past it) and its observation says so.
    ``persistent`` keeps one bubblewrap instance per :class:`~cadenza.sandbox.Sandbox` with an exec server
    inside (a few ms per call instead of a bubblewrap start); off, every call starts its own bubblewrap.
    ``network`` shares the host's network namespace (bubblewrap ``--share-net``): only the task factory's
    install phase sets it, so pip can reach the package registry; every test run has no network.
    """

    timeout_s: float = 60.0
    cpu_s: int = 600
    memory_bytes: int = 4 * GiB
    max_procs: int = 256
    max_file_bytes: int = 512 * MiB
    disk_quota_bytes: int | None = 1 * GiB
    tmpfs_bytes: int = 512 * MiB
    max_output_bytes: int = 32_000
    home: str = "/home/agent"
    extra_ro_binds: list[str] = field(default_factory=list)
    no_sandbox: bool = False
    persistent: bool = True
    network: bool = False

    def __post_init__(self) -> None:
        for name in (
            "timeout_s",
            "cpu_s",
            "memory_bytes",
            "max_procs",
            "max_file_bytes",
            "tmpfs_bytes",
            "max_output_bytes",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"sandbox {name} must be positive, got {getattr(self, name)!r}")
        if self.disk_quota_bytes is not None and self.disk_quota_bytes <= 0:
            raise ConfigError(
                f"sandbox disk_quota_bytes must be positive (or unset), got {self.disk_quota_bytes!r}"
            )
        if not self.home.startswith("/"):
            raise ConfigError(f"sandbox home must be an absolute path, got {self.home!r}")
