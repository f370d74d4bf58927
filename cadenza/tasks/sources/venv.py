"""Environments: one cached, deps-only *base* venv per requirement set and a light venv per task.

The base venv holds the source's dependencies, its test dependencies and the tooling (pytest,
pytest-timeout, coverage) but NEVER the source package itself: a non-editable copy in
site-packages would hand the agent the deleted code. A task venv is a ``--without-pip`` venv whose
single ``.pth`` file puts the task workspace (or ``workspace/src``) on ``sys.path`` and chains the
base site-packages, plus a minimal ``NAME.dist-info`` so ``importlib.metadata`` finds the project.
Creating one takes milliseconds, so every candidate workspace gets its own.

Nothing touches a pip cache (``--no-cache-dir`` everywhere), so no cache can hold the package.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import venv
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cadenza.errors import SourceError
from cadenza.tasks.sources.deps import TOOLING, Requirements, discover_requirements, req_name
from cadenza.tasks.sources.isolate import run_pip, run_python
from cadenza.tasks.sources.source import SourceInfo

ENV_FORMAT = 1  # bump to invalidate cached base environments
PY_VER = f"python{sys.version_info.major}.{sys.version_info.minor}"


@dataclass(kw_only=True)
class BaseEnv:
    """A ready base venv (``root``) seen from one source: what a task env must chain and advertise."""

    root: Path
    site_packages: Path
    dist_name: str
    version: str
    import_root: str
    packages: list[str]
    requirements: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["root"], d["site_packages"] = str(self.root), str(self.site_packages)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> BaseEnv:
        d = dict(d)
        return cls(**{**d, "root": Path(d["root"]), "site_packages": Path(d["site_packages"])})


def default_cache_dir() -> Path:
    return Path(os.environ.get("CADENZA_ENV_CACHE") or Path.home() / ".cache" / "cadenza" / "envs")


def _pip(python: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """pip for the venv of ``python``, in the sandbox: only that venv is writable (sdists run setup.py)."""
    proc = run_pip(list(args), workspace=python.parent.parent, target=python, timeout_s=timeout)
    if proc.returncode == -9:
        return subprocess.CompletedProcess(proc.args, 1, "", "ERROR: pip timed out")
    return proc


def _pip_error(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
    errs = [ln for ln in lines if ln.startswith("ERROR")]
    return (errs[0] if errs else (lines[-1] if lines else f"exit {proc.returncode}"))[:300]


def _site_packages(root: Path) -> Path:
    return root / "lib" / PY_VER / "site-packages"


def _install(python: Path, reqs: Requirements) -> list[str]:
    """Install tooling + runtime deps (must succeed), then test deps (best effort); return skipped reqs."""
    proc = _pip(python, "install", "--no-cache-dir", "-q", *TOOLING, *reqs.runtime)
    if proc.returncode != 0:
        raise SourceError(
            f"cannot install the dependencies ({_pip_error(proc)}); fix the requirement or pin a "
            "working version"
        )
    if not reqs.test:
        return []
    proc = _pip(python, "install", "--no-cache-dir", "-q", *reqs.test)
    if proc.returncode == 0:
        return []
    skipped = []
    for req in reqs.test:
        if _pip(python, "install", "--no-cache-dir", "-q", req).returncode != 0:
            skipped.append(req)
    return skipped


def _own_copies(site: Path, packages: list[str], dist_name: str) -> list[str]:
    """Names of the source's own package found in ``site`` (dists or importable top-level names)."""
    found = []
    norm = req_name(dist_name)
    for entry in site.iterdir():
        if entry.name.endswith((".dist-info", ".egg-info")) and req_name(entry.name.split("-")[0]) == norm:
            found.append(entry.name)
        stem = entry.name[:-3] if entry.name.endswith(".py") else entry.name
        if stem in packages and (entry.is_dir() or entry.suffix == ".py"):
            found.append(entry.name)
    return found


def _tooling_ok(root: Path) -> bool:
    with tempfile.TemporaryDirectory(prefix="cadenza-probe-") as tmp:
        probe = run_python(root / "bin" / "python", "import pytest, coverage, pytest_timeout", cwd=Path(tmp))
    return probe.returncode == 0


def _leak_message(source: SourceInfo, what: str) -> str:
    return (
        f"{source.name}: its environment would hold an installed copy of the package itself ({what}); "
        "such a source cannot get a leak-free environment"
    )


def ensure_base_env(source: SourceInfo, cache_dir: Path | None = None) -> BaseEnv:
    """Build (or reuse) the deps-only base venv for ``source``; cached by requirements + Python.

    Safe under concurrent callers (a per-key file lock); built in a temp dir and renamed, so an
    interrupted build never leaves a half-made environment behind.
    """
    cache_dir = Path(cache_dir or default_cache_dir())
    cache_dir.mkdir(parents=True, exist_ok=True)
    reqs = discover_requirements(source.root, [source.name, *source.packages], source.test_paths)
    key_data = {
        "format": ENV_FORMAT,
        "python": sys.version,
        "base": sys.base_prefix,
        "runtime": sorted(reqs.runtime),
        "test": sorted(reqs.test),
        "tooling": TOOLING,
    }
    key = hashlib.sha256(json.dumps(key_data, sort_keys=True).encode()).hexdigest()[:16]
    root = cache_dir / f"base-{key}"
    info_path = root / "cadenza-env.json"
    with open(cache_dir / f".base-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not info_path.is_file():
            if root.exists():
                shutil.rmtree(root)
            tmp = Path(tempfile.mkdtemp(prefix=f".tmp-base-{key}-", dir=cache_dir))
            try:
                venv.EnvBuilder(with_pip=False, symlinks=True, clear=True).create(tmp)
                skipped = _install(tmp / "bin" / "python", reqs)
                site = _site_packages(tmp)
                if _own_copies(site, source.packages, source.name):
                    # A dependency dragged the package itself in: remove it if the tooling survives that.
                    _pip(tmp / "bin" / "python", "uninstall", "-y", source.name)
                    if _own_copies(site, source.packages, source.name) or not _tooling_ok(tmp):
                        raise SourceError(_leak_message(source, "the test tooling needs it"))
                (tmp / "cadenza-env.json").write_text(json.dumps({**key_data, "skipped": skipped}, indent=1))
                tmp.rename(root)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
    copies = _own_copies(_site_packages(root), source.packages, source.name)
    if copies:  # e.g. a cached env whose dependencies include a package of this very name
        raise SourceError(_leak_message(source, ", ".join(copies)))
    info = json.loads(info_path.read_text())
    return BaseEnv(
        root=root,
        site_packages=_site_packages(root),
        dist_name=source.name,
        version=source.version,
        import_root=source.import_root,
        packages=list(source.packages),
        requirements=reqs.runtime + reqs.test,
        skipped=list(info.get("skipped", [])),
    )


def make_task_env(base: BaseEnv, workspace: Path, env_dir: Path) -> Path:
    """Create the light task venv in ``env_dir`` for ``workspace``; return its python executable.

    The workspace path is written relative to the env's site-packages, so a task directory holding
    both ``env/`` and ``workspace/`` can be moved as a whole. The base env path stays absolute.
    """
    env_dir = Path(env_dir)
    if env_dir.exists():
        shutil.rmtree(env_dir)
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env_dir)
    site = _site_packages(env_dir)
    import_dir = Path(workspace).resolve() / base.import_root
    rel = os.path.relpath(import_dir, site.resolve())
    base_site = base.site_packages.resolve()
    (site / "cadenza_task.pth").write_text(f"{rel}\nimport site; site.addsitedir({str(base_site)!r})\n")
    dist = re.sub(r"[-_.]+", "_", base.dist_name)
    info = site / f"{dist}-{base.version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {base.dist_name}\nVersion: {base.version}\n"
    )
    (info / "INSTALLER").write_text("cadenza\n")
    (info / "top_level.txt").write_text("".join(f"{p}\n" for p in base.packages))
    (info / "RECORD").write_text("")
    return env_dir / "bin" / "python"
