"""Whether a path lies under a root: the one helper behind every "is this inside that" check.

Lexical (:func:`is_within`, on normalised strings: a sandbox's view of paths that may not exist here) or
resolved (:func:`is_within_real`: symlinks followed, for paths on this machine).
"""

from __future__ import annotations

import os


def is_within(path: str, root: str) -> bool:
    """``path`` is ``root`` or below it, comparing the strings as they are (no symlinks followed)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def is_within_real(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> bool:
    """``path`` is ``root`` or below it once both are resolved (symlinks followed)."""
    return is_within(os.path.realpath(path), os.path.realpath(root))
