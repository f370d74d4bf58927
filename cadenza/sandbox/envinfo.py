"""What a task's Python environment needs to be visible inside the sandbox, asked of the env itself.

The interpreter is run once per environment (cached) to report its ``sys.path``, prefixes and the
module names it can import, so the bind allowlist covers exactly the directories the env reaches
(base interpreter, site-packages, directories added by ``.pth`` files) and nothing else.

This runs on the host, so it must run no code of the environment: the interpreter starts isolated and
without ``site`` (``-I -S``: no ``sitecustomize``, no ``.pth`` executed, no ``PYTHON*`` variables), and
``site``'s processing of ``.pth`` files is re-done here as text: path lines are added as ``site`` would
add them, ``import`` lines are never executed (a package installed from an arbitrary sdist may ship
one; it runs only inside the sandbox, where ``site`` runs for real).
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
import json, os, pkgutil, re, site, sys, sysconfig
stdlib = {sysconfig.get_path(k) for k in ("stdlib", "platstdlib")}
paths = [p for p in sys.path if p]
exe_dir = os.path.dirname(os.path.abspath(sys.executable))
conf = [c for c in (os.path.join(exe_dir, "pyvenv.cfg"), os.path.join(os.path.dirname(exe_dir), "pyvenv.cfg"))
        if os.path.isfile(c)]
prefix, system_site = sys.prefix, True
if conf:  # what site.venv() does: the venv is the prefix; the base's site-packages only if configured
    prefix = os.path.dirname(exe_dir)
    with open(conf[0], encoding="utf-8") as f:
        cfg = {k.strip().lower(): v.strip() for k, _, v in (ln.partition("=") for ln in f) if _}
    system_site = cfg.get("include-system-site-packages", "false").lower() == "true"
prefixes = [prefix] + ([sys.base_prefix] if conf and system_site else [])
ADDSITEDIR = re.compile(r"^import site;\s*site\.addsitedir\((['\"])([^'\"]+)\1\)\s*$")
def addsitedir(sitedir, depth=0):
    # site.addsitedir() as text: the dir, then its .pth files' path lines; an import line is never run,
    # except that the literal idiom `import site; site.addsitedir('DIR')` is followed as what it says
    sitedir = os.path.normpath(sitedir)
    if depth > 8 or not os.path.isdir(sitedir):
        return
    if sitedir not in paths:
        paths.append(sitedir)
    for name in sorted(n for n in os.listdir(sitedir) if n.endswith(".pth")):
        try:
            with open(os.path.join(sitedir, name), encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        for line in lines:
            line = line.rstrip()
            if not line or line.startswith("#"):
                continue
            if line.startswith(("import ", "import\t")):
                m = ADDSITEDIR.match(line)
                if m:
                    addsitedir(m.group(2), depth + 1)
                continue
            d = os.path.normpath(os.path.join(sitedir, line))
            if os.path.exists(d) and d not in paths:
                paths.append(d)
for sitedir in site.getsitepackages(prefixes):
    addsitedir(sitedir)
extra = [p for p in paths if p not in stdlib and not p.endswith(".zip") and "lib-dynload" not in p]
names = sorted({m.name for m in pkgutil.iter_modules(extra)})
print(json.dumps({
    "executable": sys.executable,
    "prefix": prefix,
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
            [str(Path(env) / "bin" / "python"), "-I", "-S", "-c", _PROBE],
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
