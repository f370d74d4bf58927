"""Leak scan: search everything a task can reach for remnants of its deleted code.

Reachable means the workspace (git objects included, via ``git cat-file --batch-all-objects``)
and the task's environment: its own directory, every path its ``.pth`` files and editable
finders point to, and the interpreter's non-stdlib ``sys.path``. Every file is read as bytes and
reduced to a set of stripped lines: text as is, JSON strings decoded, zip/wheel/egg and tar/sdist
members recursively, marshalled bytecode unmarshalled (string constants, names, and compiled code
objects compared with the deleted code's), any other binary through its printable runs. A file is
a finding when it holds two distinctive lines of the deleted code (one, if only one exists), a
code object compiled from it, or a ``.pyi`` stub of a removed definition.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from cadenza.tasks.leaks.scan_read import (
    _Content,
    _lines_of_text,
    _walk_files,
    channel_of,
    read_content,
    read_file,
)
from cadenza.tasks.leaks.secret import Secret, derive_secret
from cadenza.tasks.records.task import GOLD_PATCH, WORKSPACE, Task, load_task, task_env_dir
from cadenza.tasks.sources.isolate import run_python

__all__ = ["Finding", "channel_of", "read_content", "scan_paths", "scan_tasks"]

_SIGNATURE = re.compile(r"^(async\s+def|def|class)\s+\w+|^@")


@dataclass(frozen=True)
class Finding:
    task_id: str
    path: str
    channel: str
    evidence: str


def _git_objects(repo: Path) -> bytes:
    """Every object of the repository (history, reflog, stash, dangling, packed, alternates)."""
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
    try:
        res = subprocess.run(
            ["git", "-C", str(repo), "cat-file", "--batch-all-objects", "--batch", "--unordered"],
            capture_output=True,
            timeout=300,
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return b""
    return res.stdout


def git_commit_count(repo: Path) -> int | None:
    """Commits reachable from any ref, the reflog or a stash (``None`` if not a readable repo)."""
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
    try:
        res = subprocess.run(
            ["git", "-C", str(repo), "rev-list", "--all", "--reflog", "--count"],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            stdin=subprocess.DEVNULL,
        )
        commits = subprocess.run(
            ["git", "-C", str(repo), "cat-file", "--batch-all-objects", "--batch-check"],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if res.returncode != 0:
        return None
    return max(int(res.stdout.strip() or 0), sum(1 for ln in commits.stdout.splitlines() if " commit " in ln))


# --------------------------------------------------------------------------- what is reachable


def _stdlib_dirs() -> set[str]:
    import sysconfig

    paths = sysconfig.get_paths()
    return {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib") if k in paths}


def env_roots(env_dir: Path) -> list[Path]:
    """Directories an environment can import from: itself, its .pth targets, non-stdlib sys.path."""
    env_dir = Path(env_dir)
    roots: list[Path] = [env_dir]
    seen: set[str] = set()
    queue = list(env_dir.glob("lib*/python*/site-packages"))
    python = env_dir / "bin" / "python"
    if python.exists():
        code = (
            "import sys, json, sysconfig; p = sysconfig.get_paths();"
            " print(json.dumps([sys.path, [p['stdlib'], p['platstdlib']]]))"
        )
        try:
            # the environment's start-up (.pth lines of its packages) is third-party code: sandboxed
            with tempfile.TemporaryDirectory(prefix="cadenza-roots-") as tmp:
                res = run_python(python, code, cwd=Path(tmp), timeout_s=60)
            if res.returncode == 0:
                path, env_std = json.loads(res.stdout.strip().splitlines()[-1])
                stdlib = _stdlib_dirs() | {os.path.realpath(p) for p in env_std}
                for p in path:
                    real = os.path.realpath(p) if p else ""
                    in_stdlib = any(real == d or real.startswith(d + os.sep) for d in stdlib) and not (
                        "site-packages" in real or "dist-packages" in real
                    )
                    if real and os.path.isdir(real) and not in_stdlib and real != "/":
                        queue.append(Path(real))
        except (OSError, ValueError, IndexError):
            pass
    while queue:
        site = queue.pop()
        real = os.path.realpath(site)
        if real in seen or not os.path.isdir(real):
            continue
        seen.add(real)
        roots.append(Path(real))
        for pth in Path(real).glob("*.pth"):
            for line in pth.read_text(errors="replace").splitlines():
                line = line.strip()
                if line.startswith(("import ", "import\t")):  # e.g. site.addsitedir('/base/site-packages')
                    queue.extend(
                        Path(m) for m in re.findall(r"['\"](/[^'\"]+)['\"]", line) if os.path.isdir(m)
                    )
                elif line and not line.startswith("#"):
                    queue.append(Path(real) / line)
        for finder in Path(real).glob("__editable__*.py"):
            queue.extend(Path(s) for s in _string_constants(finder) if s.startswith("/") and os.path.isdir(s))
    return roots


def _string_constants(path: Path) -> list[str]:
    try:
        tree = ast.parse(path.read_text(errors="replace"))
    except (SyntaxError, ValueError, OSError):
        return []
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


# --------------------------------------------------------------------------- matching


def match(secret: Secret, display: str, content: _Content) -> str | None:
    """Evidence that ``content`` holds the deleted code of ``secret``, or None."""
    hits = sorted(secret.needles & content.lines)
    need = 1 if len(secret.needles) == 1 else 2
    if len(hits) >= need:
        return f"{len(hits)} deleted line(s), e.g. {hits[0][:80]!r}"
    codes = secret.codes & content.codes
    if codes:
        return f"compiled code of {sorted(codes)[0][0]}"
    found = sorted(
        q
        for s, q in secret.removed_names
        if (s, q) in content.stub_defs or ("__init__", q) in content.stub_defs
    )
    if found:
        return f"stub of removed {found[0]}"
    return None


@dataclass
class _RootIndex:
    """Everything in a shared root merged: a cheap prefilter before attributing hits to files."""

    lines: set[str]
    codes: set[tuple[str, bytes]]
    stubs: set[tuple[str, str]]


_ROOT_CACHE: dict[tuple[str, int], _RootIndex | None] = {}


def _root_index(root: Path) -> _RootIndex | None:
    """Merged content of a shared directory (base env site-packages), cached per process."""
    real = os.path.realpath(root)
    try:
        key = (real, os.stat(real).st_mtime_ns)
    except OSError:
        return None
    if key not in _ROOT_CACHE:
        idx = _RootIndex(set(), set(), set())
        for display, path in _walk_files(Path(real)):
            if path is None:  # a repository: never summarised, always scanned in full
                idx = None
                break
            content = read_file(display, path)
            if content is None:
                continue
            idx.lines |= content.lines
            idx.codes |= content.codes
            idx.stubs |= content.stub_defs
        _ROOT_CACHE[key] = idx
    return _ROOT_CACHE[key]


def _may_hold(idx: _RootIndex, secret: Secret) -> bool:
    return bool(
        secret.needles & idx.lines
        or secret.codes & idx.codes
        or any((s, q) in idx.stubs or ("__init__", q) in idx.stubs for s, q in secret.removed_names)
    )


def scan_paths(
    targets: Iterable[tuple[Path, Secret]], shared: Iterable[tuple[Path, Secret]] = ()
) -> list[Finding]:
    """Scan each (root, secret) pair; files reachable from several roots are read once.

    ``shared`` roots (a base environment many tasks chain) are summarised once per process and
    only searched file by file for the secrets their summary may hold.
    """
    targets = list(targets)
    for root, secret in shared:
        idx = _root_index(root)
        if idx is None or _may_hold(idx, secret):
            targets.append((root, secret))
    per_file: dict[str, tuple[str, Path | None, list[Secret]]] = {}
    for root, secret in targets:
        if secret.empty:
            continue
        for display, real in _walk_files(Path(root)):
            key = os.path.realpath(real) if real is not None else os.path.realpath(display) + "#git"
            entry = per_file.setdefault(key, (display, real, []))
            if all(s is not secret for s in entry[2]):
                entry[2].append(secret)
    findings: list[Finding] = []
    for display, real, secrets in per_file.values():
        if real is None:
            repo = Path(display).parent
            content = read_content(display, _git_objects(repo))
            count = git_commit_count(repo)
            if count is not None and count > 1:
                findings.extend(
                    Finding(
                        task_id=s.task_id,
                        path=display,
                        channel="git",
                        evidence=f"{count} commits (history must be a single commit)",
                    )
                    for s in secrets
                )
            display = f"{display} (objects)"
        else:
            content = read_file(display, real)
            if content is None:
                continue
        for s in secrets:
            evidence = match(s, display, content)
            if evidence:
                findings.append(
                    Finding(task_id=s.task_id, path=display, channel=channel_of(display), evidence=evidence)
                )
    return findings


def without_lines(secret: Secret, common: set[str]) -> Secret:
    """``secret`` with the needles in ``common`` dropped (they are no evidence)."""
    if not common & secret.needles:
        return secret
    needles = secret.needles - common
    return dataclasses.replace(
        secret,
        needles=needles,
        docstring_lines=secret.docstring_lines & needles,
        signature_lines=secret.signature_lines & needles,
    )


def copy_suffixes(patched_files: Iterable[str]) -> tuple[str, ...]:
    """Path endings that mark a file as an installed or vendored copy of a patched module:
    ``pkg/mod.py`` for ``src/pkg/mod.py``; a bare file name only for a top-level module."""
    out: set[str] = set()
    for rel in patched_files:
        parts = [p for p in PurePosixPath(rel).parts if p not in (".", "src", "lib")]
        if len(parts) == 1:
            out.add("/" + parts[0])
        out |= {"/" + "/".join(parts[i:]) for i in range(len(parts) - 1)}
    return tuple(sorted(out))


def distinctive_in(secret: Secret, roots: Iterable[Path]) -> Secret:
    """Drop the needles that third-party files of an environment also hold: no evidence of a leak.

    A line of the deleted code that a package of the environment contains too (``except
    AttributeError:``, ``return self._data[key]``) proves nothing. Copies of the deleted code are not
    reference: a file at the path of a patched module (``pkg/mod.py``, installed or vendored) or one
    holding at least half of three or more needles keeps its lines as evidence.
    """
    if not secret.needles:
        return secret
    suffixes = copy_suffixes(secret.patched_files)
    common: set[str] = set()
    for root in roots:
        idx = _root_index(root)
        if idx is not None and not secret.needles & idx.lines:
            continue  # the cached summary says no file of this root holds a needle
        for display, path in _walk_files(Path(root)):
            if path is None or display.endswith(suffixes):
                continue
            content = read_file(display, path)
            hits = secret.needles & content.lines if content is not None else set()
            if hits and not (len(secret.needles) >= 3 and len(hits) * 2 >= len(secret.needles)):
                common |= hits
    return without_lines(secret, common)


def task_secret(task_dir: Path, task: Task | None = None) -> Secret:
    task = task or load_task(task_dir)
    patch = (Path(task_dir) / GOLD_PATCH).read_text(errors="replace")
    return derive_secret(task.id, Path(task_dir) / WORKSPACE, patch)


def scan_tasks(task_dirs: Iterable[Path]) -> list[Finding]:
    """Scan tasks' workspaces, environments and statements; shared env dirs are read once."""
    targets: list[tuple[Path, Secret]] = []
    shared: list[tuple[Path, Secret]] = []
    findings: list[Finding] = []
    for task_dir in task_dirs:
        task = load_task(task_dir)
        env = task_env_dir(task_dir, task)
        own = os.path.realpath(task_dir) + os.sep
        roots = env_roots(env) if env.is_dir() else []
        outside = [r for r in roots if not (os.path.realpath(r) + os.sep).startswith(own)]
        # lines the environment's own packages hold too are no evidence, there or anywhere else
        secret = distinctive_in(task_secret(task_dir, task), outside)
        targets.append((Path(task_dir) / WORKSPACE, secret))
        for root in roots:
            (shared if root in outside else targets).append((root, secret))
        # The statement may quote signatures and docstrings (what a developer could know), never bodies.
        body = {
            n
            for n in secret.needles - secret.docstring_lines - secret.signature_lines
            if not _SIGNATURE.match(n)
        }
        code_only = dataclasses.replace(
            secret, needles=frozenset(body), codes=frozenset(), removed_names=frozenset()
        )
        statement = _Content(_lines_of_text(task.statement), set(), set())
        evidence = match(code_only, "task.json:statement", statement)
        if evidence:
            findings.append(
                Finding(
                    task_id=task.id,
                    path=str(Path(task_dir) / "task.json"),
                    channel="statement",
                    evidence=evidence,
                )
            )
    return findings + scan_paths(targets, shared)


def find_task_dirs(path: Path) -> list[Path]:
    """A task dir itself, or the task dirs of a task set (directories holding task.json)."""
    path = Path(path)
    if (path / "task.json").is_file():
        return [path]
    return sorted(p.parent for p in path.glob("*/task.json") if not p.parent.name.startswith("."))
