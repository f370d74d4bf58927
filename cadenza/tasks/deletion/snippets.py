"""What a deletion leaves behind for the leak scanner: the gold patch (a ``git apply``-able unified diff),
the removed snippets worth searching for, and the lines a scan of site-packages would see anyway."""

from __future__ import annotations

import difflib
import re
from collections.abc import Collection, Iterable
from pathlib import Path


def unified_patch(
    changes: Iterable[tuple[str, str | None, str | None]], modes: dict[str, int] | None = None
) -> str:
    """A git-style unified diff from ``(path, before, after)`` triples (``None`` = file absent)."""
    modes = modes or {}
    out: list[str] = []
    for path, before, after in sorted(changes, key=lambda c: c[0]):
        if before == after:
            continue
        out.append(f"diff --git a/{path} b/{path}\n")
        if before is None:
            out.append(f"new file mode {modes.get(path, 0o100644):o}\n")
        elif after is None:
            out.append(f"deleted file mode {modes.get(path, 0o100644):o}\n")
        a_lines = _lines(before or "")
        b_lines = _lines(after or "")
        out.append(f"--- {'/dev/null' if before is None else 'a/' + path}\n")
        out.append(f"+++ {'/dev/null' if after is None else 'b/' + path}\n")
        for line in list(difflib.unified_diff(a_lines, b_lines, n=3))[2:]:
            if line.endswith("\n"):
                out.append(line)
            else:
                out.append(line + "\n\\ No newline at end of file\n")
    return "".join(out)


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


_TRIVIAL_LINE = re.compile(
    r"^[\W_]*$|^(return|pass|else|try|finally|break|continue|raise|yield)\b\W*\w{0,6}\W*$"
)


def removed_snippets(
    removed_code: str,
    docstring: str | None,
    remaining_texts: Iterable[str],
    *,
    known_lines: Collection[str] = (),
    min_len: int = 12,
    limit: int = 24,
) -> list[str]:
    """Distinctive lines of ``removed_code`` (and its docstring) that no remaining Python file contains.

    Order: the definition line, the docstring's first paragraph, then body lines longest first.
    A line still present in the workspace's code (a level-1 signature, a common idiom) is not
    evidence of a leak and is left out (docs and text files are not consulted: a body copied into
    the docs IS a leak), and so is any line in ``known_lines`` (stripped lines of the
    environment's site-packages, where a scanner would find generic lines such as ``def __init__(self):``);
    when nothing of ``min_len`` is left, shorter lines are used.
    """
    remaining = list(remaining_texts)
    for length in (min_len, 6):
        candidates: list[str] = []
        for line in removed_code.splitlines():
            s = line.strip()
            if (
                s.startswith("#")
                or len(s) < length
                or _TRIVIAL_LINE.match(s)
                or s in candidates
                or s in known_lines
            ):
                continue
            candidates.append(s)
        ordered = [c for c in candidates if c.startswith(("def ", "async def ", "class "))]
        doc = (docstring or "").strip().split("\n\n")[0].strip()
        if len(doc) >= length:
            ordered.append(doc)
        ordered += sorted((c for c in candidates if c not in ordered), key=len, reverse=True)
        out = [c for c in ordered if not any(c in text for text in remaining)]
        if out:
            return out[:limit]
    return []


def site_lines(site_packages: Path) -> frozenset[str]:
    """Stripped lines of every ``.py`` file under ``site_packages`` (what an env-wide scan would see)."""
    lines: set[str] = set()
    for p in Path(site_packages).rglob("*.py"):
        try:
            lines.update(ln.strip() for ln in p.read_text(errors="replace").splitlines())
        except OSError:
            continue
    return frozenset(lines)
