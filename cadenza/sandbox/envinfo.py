"""What a task's Python environment needs to be visible inside the sandbox, asked of the env itself.

The interpreter is run once per environment (cached) to report its ``sys.path``, prefixes and the
module names it can import, so the bind allowlist covers exactly the directories the env reaches
(base interpreter, site-packages, directories added by ``.pth`` files) and nothing else.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cadenza.errors import SandboxError

_PROBE = r"""
import json, pkgutil, sys, sysconfig
stdlib = {sysconfig.get_path(k) for k in ("stdlib", "platstdlib")}
paths = [p for p in sys.path if p]
extra = [p for p in paths if p not in stdlib and not p.endswith(".zip") and "lib-dynload" not in p]
names = sorted({m.name for m in pkgutil.iter_modules(extra)})
print(json.dumps({
    "executable": sys.executable,
    "prefix": sys.prefix,
    "base_prefix": sys.base_prefix,
    "base_exec_prefix": sys.base_exec_prefix,
    "sys_path": paths,
    "stdlib_names": sorted(sys.stdlib_module_names),
    "installed_names": names,
}))
"""


@dataclass(frozen=True, kw_only=True)
class EnvInfo:
    env_dir: str
    executable: str
    prefix: str
    base_prefix: str
    base_exec_prefix: str
    sys_path: tuple[str, ...]
    stdlib_names: frozenset[str]
    installed_names: frozenset[str]

    @property
    def python(self) -> str:
        return str(Path(self.env_dir) / "bin" / "python")

    def importable_names(self) -> frozenset[str]:
        """Top-level module names a file in the workspace could shadow (stdlib + installed)."""
        return self.stdlib_names | self.installed_names


def env_info(env_dir: str | os.PathLike[str]) -> EnvInfo:
    """Inspect ``env_dir`` (a venv or prefix with ``bin/python``); cached per environment state."""
    env = Path(env_dir).absolute()
    python = env / "bin" / "python"
    if not python.exists():
        raise SandboxError(f"environment {env} has no bin/python; rebuild the task environment")
    stamp = env / "pyvenv.cfg"
    mtime = stamp.stat().st_mtime_ns if stamp.exists() else python.stat().st_mtime_ns
    return _probe(str(env), mtime)


@functools.lru_cache(maxsize=64)
def _probe(env: str, _mtime: int) -> EnvInfo:
    clean = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    try:
        out = subprocess.run(
            [str(Path(env) / "bin" / "python"), "-c", _PROBE],
            capture_output=True,
            text=True,
            cwd="/",
            env=clean,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxError(
            f"cannot run the python of environment {env} ({exc}); rebuild the task environment"
        ) from None
    if out.returncode != 0:
        tail = out.stderr.strip().splitlines()[-1:] or ["no output"]
        raise SandboxError(
            f"the python of environment {env} fails to start ({tail[0]}); rebuild the task environment"
        )
    data = json.loads(out.stdout)
    return EnvInfo(
        env_dir=env,
        executable=data["executable"],
        prefix=data["prefix"],
        base_prefix=data["base_prefix"],
        base_exec_prefix=data["base_exec_prefix"],
        sys_path=tuple(data["sys_path"]),
        stdlib_names=frozenset(data["stdlib_names"]),
        installed_names=frozenset(data["installed_names"]),
    )
