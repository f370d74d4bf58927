"""Confine agent-supplied paths to the workspace: no ``..`` escapes, no symlinks pointing out."""

from __future__ import annotations

import os
from pathlib import Path

from cadenza.pathrel import is_within


class PathOutsideWorkspace(ValueError):
    """The path (or what a symlink in it points at) lies outside the workspace."""


def confine(workspace: Path, path: str) -> Path:
    """Resolve ``path`` (relative to the workspace, or absolute inside it) to a real path inside it."""
    root = os.path.realpath(workspace)
    if "\x00" in path:
        raise PathOutsideWorkspace(f"path {path!r} contains a NUL byte")
    raw = path if os.path.isabs(path) else os.path.join(str(workspace), path)
    lexical = os.path.normpath(raw)
    if not is_within(lexical, os.path.normpath(str(workspace))) and not is_within(lexical, root):
        raise PathOutsideWorkspace(f"path {path!r} is outside the workspace {workspace}")
    real = os.path.realpath(lexical)
    if not is_within(real, root):
        raise PathOutsideWorkspace(
            f"path {path!r} resolves (through a symlink) to {real}, outside the workspace"
        )
    return Path(real)


def display(workspace: Path, path: Path) -> str:
    """A workspace-relative name for messages."""
    try:
        rel = path.relative_to(os.path.realpath(workspace))
    except ValueError:
        return str(path)
    return str(rel) if str(rel) != "." else "."
