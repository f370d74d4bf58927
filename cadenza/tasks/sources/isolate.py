"""Where the task factory runs third-party code: always inside bubblewrap, never on the host.

A source is arbitrary code from a package registry: ``pip`` runs the ``setup.py`` (or build backend) of
every sdist it installs, downloads or asks for metadata, importing the package runs its module code,
and a test suite runs whatever it likes. Every such step goes through :func:`run_sandboxed` (the one
sandbox runner, :class:`cadenza.sandbox.Sandbox`, in per-call mode): only the step's own directories
are writable, the process, CPU, memory, file-size and disk limits of an agent apply, and the network is
reachable only by pip, and only the package registry (:func:`run_pip`, the install phase: its own network
namespace plus a relay to a host-side proxy that lets through ``CONNECT`` to the registry alone; see
:mod:`cadenza.sandbox.egress`); test and probe runs have no network at all.
Test runs themselves go through :func:`cadenza.tasks.sources.runner.run_pytest` with a sandbox config.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from cadenza.sandbox import Sandbox, SandboxConfig
from cadenza.sandbox.config import GiB
from cadenza.sandbox.egress import RELAY_PROGRAM, RegistryProxy, registry_endpoints

#: Probes of a task environment (imports, option listing): no network, an agent's limits.
PROBE = SandboxConfig(timeout_s=120.0, persistent=False)
#: pip installs, downloads and metadata builds: the registry only (:func:`run_pip`), room for wheels.
INSTALL = SandboxConfig(
    timeout_s=900.0,
    cpu_s=1800,
    network=False,
    persistent=False,
    disk_quota_bytes=8 * GiB,
    tmpfs_bytes=4 * GiB,
    max_output_bytes=64_000,
)


@dataclass
class SandboxCPU:
    """What the benchmark must add for sandboxed work: a bubblewrap run's processes are not the host's
    rusage children. ``seconds``: CPU of test runs as the runner's plugin reports it; the other runs
    (pip, probes) report only their count and wall time, an upper bound on their CPU."""

    seconds: float = 0.0
    pip_runs: int = 0
    pip_wall_s: float = 0.0
    probe_runs: int = 0
    probe_wall_s: float = 0.0


SANDBOX_CPU = SandboxCPU()


def run_sandboxed(
    argv: list[str],
    *,
    workspace: Path,
    config: SandboxConfig,
    env_dir: Path | None = None,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    readable: list[str] | None = None,
    writable: list[Path] | None = None,
    timeout_s: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in a one-shot sandbox where ``workspace`` and ``writable`` are the only writable paths.

    ``env_dir``: the Python environment whose interpreter and ``sys.path`` are bound read-only;
    ``readable``: further read-only paths. A timeout reads as exit -9 with "timed out" in stderr.
    """
    cfg = replace(config, persistent=False, extra_ro_binds=[*config.extra_ro_binds, *(readable or [])])
    box = Sandbox(workspace, env_dir=env_dir, config=cfg, rw_extra=list(writable or []))
    try:
        res = box.run(argv, timeout_s=timeout_s, cwd=cwd, env=env)
    finally:
        box.close()
    if config is INSTALL or config.network:  # the install phase
        SANDBOX_CPU.pip_runs += 1
        SANDBOX_CPU.pip_wall_s += res.duration_s
    else:
        SANDBOX_CPU.probe_runs += 1
        SANDBOX_CPU.probe_wall_s += res.duration_s
    stderr = res.stderr + ("\ntimed out" if res.timed_out else "")
    return subprocess.CompletedProcess(argv, -9 if res.timed_out else res.exit_code, res.stdout, stderr)


def run_python(
    python: Path, code: str, *, cwd: Path, timeout_s: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """Run a snippet with a task environment's ``python`` in ``cwd`` (writable), no network."""
    env = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0", "PYTHONNOUSERSITE": "1"}
    return run_sandboxed(
        [str(python), "-c", code],
        workspace=Path(cwd),
        config=PROBE,
        env_dir=Path(python).parent.parent,
        env=env,
        timeout_s=timeout_s,
    )


@functools.lru_cache(maxsize=1)
def _host_pip_settings() -> tuple[tuple[str, str], ...]:
    """The host's pip configuration (its config files live in a home the sandbox cannot see)."""
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    found: dict[str, str] = {}
    for line in out.splitlines():
        key, eq, value = line.partition("=")
        section, _, name = key.partition(".")
        if eq and section in ("global", "install", "download") and name:
            found[f"PIP_{name.upper().replace('-', '_')}"] = value.strip().strip("'\"")
    found.update({k: v for k, v in os.environ.items() if k.startswith("PIP_")})
    for k in ("PIP_REQUIRE_VIRTUALENV", "PIP_NO_INDEX", "PIP_TARGET", "PIP_PREFIX", "PIP_USER"):
        found.pop(k, None)
    return tuple(sorted(found.items()))


def pip_env() -> dict[str, str]:
    """Environment for pip in the sandbox: the host's index, find-links and certificates, no cache."""
    env = dict(_host_pip_settings())
    env.update({"PIP_NO_INDEX": "0", "PIP_NO_CACHE_DIR": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    for k in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"):
        if k in os.environ:
            env[k] = os.environ[k]
    return env


def pip_local_paths(env: dict[str, str]) -> list[str]:
    """Local paths the pip settings point at, bound read-only: find-links and certificates, and for a
    ``file://`` index the directory holding it (its pages link to files next to ``simple/``)."""
    paths: list[str] = []
    for key in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_CERT", "PIP_CONSTRAINT"):
        for item in env.get(key, "").split():
            path = item[len("file://") :] if item.startswith("file://") else item
            if key.endswith("INDEX_URL") and item.startswith("file://"):
                path = os.path.dirname(path.rstrip("/")) or path
            local = path.startswith("/") and path != "/" and not path.startswith(SYSTEM_READABLE)
            if local and os.path.exists(path):
                paths.append(path)
    return paths


SYSTEM_READABLE = ("/usr/", "/etc/", "/bin/", "/lib/")


def run_pip(
    args: list[str], *, workspace: Path, target: Path | None = None, timeout_s: float = 900.0
) -> subprocess.CompletedProcess[str]:
    """``pip ARGS`` (this interpreter's pip, for the ``target`` interpreter if given) in a sandbox.

    ``workspace`` is the only writable directory (the venv being filled, a download or report
    directory). The sandbox has its own network namespace; pip reaches the registry named by the pip
    settings through :class:`~cadenza.sandbox.egress.RegistryProxy` and nothing else (a plain
    ``http://`` registry cannot be told apart from other hosts by a proxy: then the host's network is
    shared, as before, and the docs say so).
    """
    cmd = [sys.executable, "-m", "pip", *(["--python", str(target)] if target else []), *args]
    env = pip_env()
    own = Path(sys.prefix)  # this interpreter's environment, where pip itself lives
    readable = pip_local_paths(env)
    if not (own / "bin" / "python").exists():
        own, readable = None, [*readable, sys.base_prefix, *(p for p in sys.path if os.path.isdir(p))]
    endpoints = registry_endpoints(env)
    if endpoints is None:
        return run_sandboxed(cmd, workspace=workspace, config=replace(INSTALL, network=True), env_dir=own,
                             env=env, readable=readable, timeout_s=timeout_s)  # fmt: skip
    with RegistryProxy(endpoints) as proxy:
        relayed = [sys.executable, "-I", "-S", RELAY_PROGRAM, proxy.socket_path, "--", *cmd]
        return run_sandboxed(relayed, workspace=workspace, config=INSTALL, env_dir=own, env=env,
                             readable=[*readable, RELAY_PROGRAM], writable=[Path(proxy.socket_dir)],
                             timeout_s=timeout_s)  # fmt: skip
