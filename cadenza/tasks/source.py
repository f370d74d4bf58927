"""Fetch a task source (local dir, local git repo, or ``pypi:NAME[==VER]`` sdist) into a private copy.

The original is never modified: every later stage (environment, coverage, deletion) works on the
copy made here. :class:`SourceInfo` records what the rest of the pipeline needs to know about the
layout: which importable names belong to the project and where they live.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from dataclasses import dataclass, field
from email.parser import Parser
from pathlib import Path
from typing import Literal

from cadenza.errors import SourceError

Layout = Literal["flat", "src", "tests-inside-package"]

#: Directories never copied from a source (build outputs, caches, VCS and tool state).
IGNORED_DIRS = {
    ".git",
    ".hg",
    ".svn",
    "__pycache__",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    ".hypothesis",
    ".tox",
    ".nox",
    ".venv",
    "venv",
    ".eggs",
    "build",
    "dist",
    "node_modules",
    ".idea",
    ".vscode",
}
IGNORED_SUFFIXES = (".pyc", ".pyo", ".egg-info")
#: Top-level names that are never the project's importable package.
NON_PACKAGE_NAMES = {
    "test",
    "tests",
    "testing",
    "docs",
    "doc",
    "examples",
    "example",
    "benchmarks",
    "benchmark",
    "bench",
    "scripts",
    "tools",
    "ci",
    "setup",
    "conftest",
    "noxfile",
    "tasks",
    "fabfile",
    "build",
    "dist",
    "site",
}
TEST_DIR_NAMES = {"test", "tests", "testing"}
SDIST_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".zip")


@dataclass(kw_only=True)
class SourceInfo:
    """A fetched source: ``root`` is the private copy; ``packages`` are its importable top-level names.

    ``package_dirs`` maps each import name to its path relative to ``root`` (a package directory or a
    single ``.py`` module). ``import_root`` is the directory that must be on ``sys.path`` (``"."`` or
    ``"src"``). ``test_paths`` are root-relative test files and pytest configuration files.
    """

    spec: str
    root: Path
    name: str
    packages: list[str]
    package_dirs: dict[str, str]
    import_root: str
    layout: Layout
    version: str
    content_hash: str
    test_paths: list[str] = field(default_factory=list)


def _ignore(_dir: str, names: list[str]) -> set[str]:
    return {n for n in names if n in IGNORED_DIRS or n.endswith(IGNORED_SUFFIXES)}


def copy_tree(src: Path, dest: Path) -> None:
    """Copy a source tree without caches, build outputs or VCS data.

    Symlinks are copied as links, except those pointing outside the tree (dropped: a task must not
    reach files beyond its workspace).
    """
    shutil.copytree(src, dest, symlinks=True, ignore=_ignore)
    root = Path(dest).resolve()
    for p in list(Path(dest).rglob("*")):
        if p.is_symlink():
            target = (p.parent / os.readlink(p)).resolve()
            if not target.is_relative_to(root):
                p.unlink()


def content_hash(root: Path) -> str:
    """sha256 over sorted relative paths and file bytes: identical trees hash identically."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        rel = path.relative_to(root).as_posix()
        h.update(rel.encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def fetch_source(spec: str, dest: Path) -> SourceInfo:
    """Copy ``spec`` into ``dest`` (which must not exist yet) and describe it.

    ``spec`` is a local directory, a local git repository (the committed tree of ``HEAD`` is copied,
    never ``.git``), a local sdist archive, or ``pypi:NAME[==VERSION]`` (the sdist, downloaded with
    pip without any cache).
    Raises :class:`SourceError` for a nonexistent path, a tree with no tests, or a non-Python tree.
    """
    dest = Path(dest)
    if dest.exists():
        raise SourceError(f"destination {dest} already exists; pass an empty work directory")
    dest.parent.mkdir(parents=True, exist_ok=True)
    if spec.startswith("pypi:"):
        _fetch_pypi(spec[len("pypi:") :].strip(), dest)
    else:
        src = Path(spec).expanduser()
        if not src.exists():
            raise SourceError(
                f"source {spec} does not exist; pass a directory, a git repository or pypi:NAME"
            )
        if src.is_file() and src.name.endswith(SDIST_SUFFIXES):
            _unpack(src, dest, f"source {spec}")
            return describe_source(spec, dest)
        if not src.is_dir():
            raise SourceError(
                f"source {spec} is not a directory or an sdist archive; pass a directory, a git repository, "
                "an sdist (.tar.gz/.zip) or pypi:NAME"
            )
        if (src / ".git").exists():
            _fetch_git(src, dest)
        else:
            copy_tree(src, dest)
    return describe_source(spec, dest)


def _fetch_git(src: Path, dest: Path) -> None:
    proc = subprocess.run(
        ["git", "-C", str(src), "archive", "--format=tar", "HEAD"], capture_output=True, timeout=300
    )
    if proc.returncode != 0:
        msg = proc.stderr.decode(errors="replace").strip().splitlines()
        raise SourceError(
            f"git source {src}: cannot read HEAD ({msg[-1] if msg else 'git archive failed'}); commit the tree first"
        )
    dest.mkdir()
    with tempfile.TemporaryFile() as fh:
        fh.write(proc.stdout)
        fh.seek(0)
        with tarfile.open(fileobj=fh) as tar:
            tar.extractall(dest, filter="data")
    for p in list(dest.rglob("*")):
        if p.is_dir() and p.name in IGNORED_DIRS:
            shutil.rmtree(p, ignore_errors=True)


def _fetch_pypi(req: str, dest: Path) -> None:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*(\s*==\s*[A-Za-z0-9.+!_-]+)?", req):
        raise SourceError(
            f"pypi source '{req}' is not NAME or NAME==VERSION; write e.g. pypi:cachetools==5.3.3"
        )
    with tempfile.TemporaryDirectory(prefix="cadenza-sdist-") as tmp:
        files, reason = _pip_download(req.replace(" ", ""), Path(tmp))
        if not files:
            raise SourceError(f"pypi:{req}: cannot download an sdist ({reason}); check the name and version")
        _unpack(files[0], dest, f"pypi:{req}")


def _unpack(archive: Path, dest: Path, label: str) -> None:
    """Extract an sdist (``.tar.gz``/``.tgz``/``.tar.bz2``/``.zip``) safely; copy its single top dir to ``dest``."""
    with tempfile.TemporaryDirectory(prefix="cadenza-unpack-") as tmp:
        unpack = Path(tmp)
        if archive.name.endswith(".zip"):
            try:
                with zipfile.ZipFile(archive) as zf:
                    for member in zf.namelist():
                        if not (unpack / member).resolve().is_relative_to(unpack.resolve()):
                            raise SourceError(
                                f"{label}: archive has an unsafe path {member}; refusing to unpack it"
                            )
                    zf.extractall(unpack)
            except zipfile.BadZipFile as exc:
                raise SourceError(f"{label}: {archive.name} cannot be unpacked ({exc})") from None
        else:
            try:
                with tarfile.open(archive) as tar:
                    tar.extractall(unpack, filter="data")
            except (tarfile.TarError, OSError) as exc:
                raise SourceError(f"{label}: {archive.name} cannot be unpacked ({exc})") from None
        entries = list(unpack.iterdir())
        top = entries[0] if len(entries) == 1 and entries[0].is_dir() else unpack
        copy_tree(top, dest)


def _pip_download(req: str, dest: Path) -> tuple[list[Path], str]:
    """Download the sdist of ``req`` into ``dest`` with pip, never through a cache.

    pip prepares the sdist's metadata before saving it; without build isolation that is seconds
    faster, so it is tried first (it works when this interpreter has the build backend) and the
    isolated build is the fallback.
    """
    base = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-binary",
        ":all:",
        "--no-deps",
        "--no-cache-dir",
        "-q",
        "-d",
        str(dest),
        req,
    ]
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    reason = "no sdist downloaded"
    for extra in (["--no-build-isolation"], []):
        try:
            proc = subprocess.run(base + extra, capture_output=True, text=True, timeout=600, env=env)
        except subprocess.TimeoutExpired:
            reason = "pip download timed out"
            continue
        files = [p for p in dest.iterdir() if p.is_file()]
        if proc.returncode == 0 and files:
            return files, ""
        errs = [ln for ln in proc.stderr.splitlines() if ln.startswith("ERROR")]
        reason = (
            errs[-1] if errs else reason
        )  # (a failed metadata build also reads "no matching distribution")
    return [], reason


def _is_test_file(rel: Path) -> bool:
    name = rel.name
    return (
        any(part in TEST_DIR_NAMES for part in rel.parts[:-1])
        or name == "conftest.py"
        or (name.startswith("test_") and name.endswith(".py"))
        or name.endswith("_test.py")
    )


def find_test_paths(root: Path) -> list[str]:
    """Root-relative test files (``test_*.py``, ``*_test.py``, files in test dirs, conftests) and pytest config."""
    out: list[str] = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if not path.is_file() or any(part in IGNORED_DIRS for part in rel.parts):
            continue
        if _is_test_file(rel) and path.suffix in {
            ".py",
            ".txt",
            ".json",
            ".cfg",
            ".ini",
            ".yaml",
            ".yml",
            ".toml",
            ".md",
            ".rst",
            "",
        }:
            out.append(rel.as_posix())
    for cfg in ("pytest.ini", "pyproject.toml", "setup.cfg", "tox.ini", "conftest.py"):
        if (root / cfg).is_file() and cfg not in out:
            out.append(cfg)
    return out


def is_test_path(rel: str | Path) -> bool:
    """Whether a root-relative path is test code (never a deletion target)."""
    return _is_test_file(Path(rel))


def _read_metadata(root: Path) -> tuple[str, str]:
    """(distribution name, version) from PKG-INFO, pyproject or setup.cfg; '' when unknown."""
    name = version = ""
    pkg_info = root / "PKG-INFO"
    if pkg_info.is_file():
        msg = Parser().parsestr(pkg_info.read_text(errors="replace"))
        name, version = msg.get("Name", "") or "", msg.get("Version", "") or ""
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and not name:
        try:
            project = tomllib.loads(pyproject.read_text()).get("project", {})
        except tomllib.TOMLDecodeError:
            project = {}
        name = str(project.get("name", "") or "")
        version = version or str(project.get("version", "") or "")
    setup_cfg = root / "setup.cfg"
    if setup_cfg.is_file() and not name:
        import configparser

        cp = configparser.ConfigParser(interpolation=None)
        try:
            cp.read_string(setup_cfg.read_text())
            name = cp.get("metadata", "name", fallback="")
            version = version or cp.get("metadata", "version", fallback="")
        except configparser.Error:
            pass
    return name, version


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _candidates(base: Path) -> dict[str, str]:
    """Importable top-level names directly under ``base`` -> path relative to ``base``."""
    out: dict[str, str] = {}
    if not base.is_dir():
        return out
    for entry in sorted(base.iterdir()):
        stem = entry.name[:-3] if entry.name.endswith(".py") else entry.name
        if stem in NON_PACKAGE_NAMES or stem.startswith((".", "_")) or not stem.isidentifier():
            continue
        if (entry.is_dir() and (entry / "__init__.py").is_file()) or (
            entry.is_file()
            and entry.suffix == ".py"
            and not stem.startswith("test_")
            and not stem.endswith("_test")
        ):
            out[stem] = entry.name
    if not out:
        # PEP 420 namespace packages: a plain directory holding a regular package one level down.
        for entry in sorted(base.iterdir()):
            if (
                entry.is_dir()
                and entry.name.isidentifier()
                and entry.name not in NON_PACKAGE_NAMES
                and not entry.name.startswith((".", "_"))
                and any((sub / "__init__.py").is_file() for sub in entry.iterdir() if sub.is_dir())
            ):
                out[entry.name] = entry.name
    return out


def describe_source(spec: str, root: Path) -> SourceInfo:
    """Inspect a copied tree: layout, import names, version, tests, content hash."""
    root = Path(root)
    py_files = [
        p for p in root.rglob("*.py") if not any(part in IGNORED_DIRS for part in p.relative_to(root).parts)
    ]
    if not py_files:
        raise SourceError(f"source {spec} contains no Python files; pass a Python project")
    dist, version = _read_metadata(root)
    src_pkgs = _candidates(root / "src")
    if src_pkgs:
        import_root, found = "src", src_pkgs
    else:
        import_root, found = ".", _candidates(root)
    if not found:
        raise SourceError(
            f"source {spec} has no importable package (no dir with __init__.py or module at top level or in src/)"
        )
    # Prefer names matching the distribution; otherwise keep every package-like name.
    if dist and _norm(dist) in {_norm(k) for k in found}:
        main = next(k for k in found if _norm(k) == _norm(dist))
        # Keep sibling packages (e.g. toolz ships tlz) but drop stray modules like setup helpers.
        packages = [main] + [k for k, v in found.items() if k != main and not v.endswith(".py")]
    else:
        packages = list(found)
    package_dirs = {k: (f"{import_root}/{found[k]}" if import_root != "." else found[k]) for k in packages}
    test_paths = find_test_paths(root)
    test_py = [
        t for t in test_paths if t.endswith(".py") and Path(t).name != "conftest.py" and is_test_path(t)
    ]
    test_modules = [
        t
        for t in test_py
        if Path(t).name.startswith("test") or t.endswith("_test.py") or "tests" in Path(t).parts
    ]
    if not test_modules:
        what = f"the sdist of {spec}" if spec.startswith("pypi:") else f"source {spec}"
        raise SourceError(
            f"{what} has no tests (no test_*.py, *_test.py or tests/ directory); "
            "pick a source whose sdist or tree ships its test suite"
        )
    if import_root == "src":
        layout: Layout = "src"
    elif any(t.split("/")[0] in package_dirs.values() for t in test_modules):
        layout = "tests-inside-package"
    else:
        layout = "flat"
    return SourceInfo(
        spec=spec,
        root=root,
        name=dist or packages[0],
        packages=packages,
        package_dirs=package_dirs,
        import_root=import_root,
        layout=layout,
        version=version or "0",
        content_hash=content_hash(root),
        test_paths=test_paths,
    )
