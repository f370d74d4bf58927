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
import tomllib
from dataclasses import dataclass, field
from email.parser import Parser
from pathlib import Path
from typing import Literal

from cadenza.errors import SourceError

Layout = Literal["flat", "src", "tests-inside-package"]

#: Tool caches: never source, never copied, and deleted from a task's workspace (they can hold the answer).
CACHE_DIRS = frozenset(
    {
        "__pycache__",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".hypothesis",
        ".tox",
        ".nox",
        ".eggs",
        "htmlcov",
        ".pyre",
        ".pytype",
        ".dmypy",
    }
)
#: Build outputs (a package of that name is kept where it holds an ``__init__.py``).
BUILD_DIRS = frozenset({"build", "dist"})
#: Directories never copied from a source (build outputs, caches, VCS and tool state).
IGNORED_DIRS = (
    CACHE_DIRS | BUILD_DIRS | {".git", ".hg", ".svn", ".venv", "venv", "node_modules", ".idea", ".vscode"}
)
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


def _is_test_file(rel: Path) -> bool:
    name = rel.name
    return (
        any(part in TEST_DIR_NAMES for part in rel.parts[:-1])
        or name == "conftest.py"
        or (name.startswith("test_") and name.endswith(".py"))
        or name.endswith("_test.py")
    )


def find_test_paths(root: Path) -> list[str]:
    """Root-relative test files (``test_*.py``, ``*_test.py``, files in test dirs, conftests) and pytest
    config."""
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
            f"source {spec} has no importable package (no dir with __init__.py or module at top level "
            "or in src/)"
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
