"""Reading one file for the leak scan: lines, code fingerprints and stub definitions, archives included."""

from __future__ import annotations

import gzip
import importlib.util
import io
import json
import marshal
import os
import re
import sys
import tarfile
import types
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cadenza.tasks.leaks.secret import code_key, stub_definitions

MAX_FILE_BYTES = 256 << 20
MAX_DEPTH = 4
_PRINTABLE = re.compile(rb"[\t\n\r\x20-\x7e]{8,}")
_ARCHIVE_SUFFIXES = (
    ".whl",
    ".zip",
    ".egg",
    ".tar",
    ".tar.gz",
    ".tgz",
    ".tar.bz2",
    ".tbz2",
    ".tar.xz",
    ".txz",
    ".gz",
    ".jar",
)


@dataclass
class _Content:
    lines: set[str]
    codes: set[tuple[str, bytes]]
    stub_defs: set[tuple[str, str]]  # (stub file stem, qualified name) defined in .pyi files


def channel_of(path: str) -> str:
    """A human name for where a finding sits."""
    p = path.replace("\\", "/")
    rules = [
        ("git", ("/.git/", ".git (objects)")),
        ("bytecode", ("__pycache__", ".pyc")),
        ("mypy-cache", (".mypy_cache",)),
        ("tool-cache", (".pytest_cache", ".ruff_cache", ".hypothesis", ".coverage")),
        ("egg-info", (".egg-info", "PKG-INFO", "SOURCES.txt")),
        ("dist-info", (".dist-info",)),
        ("pip-cache", ("/pip/", "pip-cache", "/http-v2/", "/wheels/")),
        ("archive", (*_ARCHIVE_SUFFIXES, "!")),
        ("build-dir", ("/build/", "/dist/", "/.tox/", "/.nox/")),
        ("site-packages", ("site-packages", "dist-packages")),
        ("stub", (".pyi",)),
        ("docs", (".md", ".rst", ".txt", ".ipynb", ".html", "/doc/", "/docs/")),
    ]
    for name, keys in rules:
        if any(k in p for k in keys):
            return name
    return "file"


# --------------------------------------------------------------------------- reading files


def _lines_of_text(text: str) -> set[str]:
    return {s for s in (ln.strip() for ln in text.splitlines()) if s}


def _json_strings(obj: object) -> Iterator[str]:
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield str(k)
            yield from _json_strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _json_strings(v)


def _code_strings(code: types.CodeType, out: _Content) -> None:
    out.codes.add(code_key(code))
    out.lines.update(code.co_names + code.co_varnames + (code.co_name, code.co_qualname))
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _code_strings(const, out)
        elif isinstance(const, str):
            out.lines |= _lines_of_text(const)
        elif isinstance(const, bytes):
            out.lines |= _lines_of_text(const.decode("utf-8", "replace"))
        elif isinstance(const, tuple | frozenset):
            out.lines.update(s for s in const if isinstance(s, str))


def read_content(name: str, data: bytes, depth: int = 0) -> _Content:
    """Reduce one file (or archive member) to lines, code fingerprints and stub definitions."""
    out = _Content(set(), set(), set())
    low = name.lower()
    if depth < MAX_DEPTH and data[:4] == b"PK\x03\x04":
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as zf:
                for info in zf.infolist():
                    if not info.is_dir() and info.file_size <= MAX_FILE_BYTES:
                        _merge(out, read_content(info.filename, zf.read(info), depth + 1))
            return out
        except (zipfile.BadZipFile, OSError, RuntimeError, ValueError, EOFError):
            pass
    if depth < MAX_DEPTH and (
        data[:2] == b"\x1f\x8b" or low.endswith((".tar", ".tar.bz2", ".tbz2", ".tar.xz", ".txz"))
    ):
        try:
            with tarfile.open(fileobj=io.BytesIO(data)) as tf:
                for member in tf:
                    if member.isfile() and member.size <= MAX_FILE_BYTES:
                        fh = tf.extractfile(member)
                        if fh is not None:
                            _merge(out, read_content(member.name, fh.read(), depth + 1))
            return out
        except (tarfile.TarError, OSError, EOFError, ValueError):
            pass
        if data[:2] == b"\x1f\x8b":
            try:
                return read_content(
                    name[:-3] if low.endswith(".gz") else name, gzip.decompress(data), depth + 1
                )
            except (OSError, EOFError, ValueError):
                pass
    if data[:4] == importlib.util.MAGIC_NUMBER and len(data) > 16:
        try:
            code = marshal.loads(data[16:])
            if isinstance(code, types.CodeType):
                _code_strings(code, out)
        except (ValueError, EOFError, TypeError):
            pass
    if b"\x00" in data[:8192]:
        for run in _PRINTABLE.findall(data):
            out.lines |= _lines_of_text(run.decode("ascii", "replace"))
        return out
    text = data.decode("utf-8", "replace")
    out.lines |= _lines_of_text(text)
    if low.endswith((".json", ".ipynb")):
        try:
            for s in _json_strings(json.loads(text)):
                out.lines |= _lines_of_text(s)
        except (ValueError, RecursionError):
            pass
    if low.endswith(".pyi"):
        out.stub_defs = {(Path(name).stem, q) for q in stub_definitions(text)}
    return out


def _merge(into: _Content, other: _Content) -> None:
    into.lines |= other.lines
    into.codes |= other.codes
    into.stub_defs |= other.stub_defs


def _is_interpreter_file(real: str) -> bool:
    prefixes = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.base_exec_prefix)}
    return any(real.startswith(p + os.sep) for p in prefixes) and "-packages" not in real


def _walk_files(root: Path) -> Iterator[tuple[str, Path | None]]:
    """(display path, real file) for every file under root; git dirs yield a virtual entry."""
    stack = [Path(root)]
    seen_dirs: set[str] = set()
    while stack:
        d = stack.pop()
        real = os.path.realpath(d)
        if real in seen_dirs:
            continue
        seen_dirs.add(real)
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            p = Path(e.path)
            if e.name == ".git":
                yield (str(p), None)  # the repository, read through git
                if e.is_dir(follow_symlinks=False):
                    stack.extend(x for x in p.iterdir() if x.name != "objects" and x.is_dir())
                    yield from ((str(x), x) for x in p.iterdir() if x.is_file())
                continue
            try:
                if e.is_dir():  # follows symlinks: a link out of the workspace is reachable
                    stack.append(p)
                elif e.is_file():
                    if e.is_symlink() and _is_interpreter_file(os.path.realpath(p)):
                        continue  # bin/python -> the base interpreter: not the project's code
                    yield (str(p), p)
            except OSError:
                continue


def read_file(display: str, path: Path) -> _Content | None:
    """The content of one file, or None when it is unreadable or larger than :data:`MAX_FILE_BYTES`."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            return None
        return read_content(display, path.read_bytes())
    except OSError:
        return None
