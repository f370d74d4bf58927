"""What a task must not leak: the deleted code, as derived from ``gold.patch``.

A :class:`Secret` holds three fingerprints of the removed code, each aimed at a different
channel: distinctive source lines (text files, archives, git objects, caches), compiled code
objects (marshalled bytecode whose source is gone) and removed definition names (``.pyi``
stubs). The original files are rebuilt by applying the gold patch to the workspace in memory,
so the fingerprints come from the exact code that was deleted.
"""

from __future__ import annotations

import ast
import builtins
import keyword
import re
import types
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

# Directory names that are never reference source: caches, builds, VCS and environment dirs.
JUNK_DIRS = frozenset(
    {
        ".git",
        "__pycache__",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".hypothesis",
        "build",
        "dist",
        ".tox",
        ".nox",
        ".eggs",
        ".venv",
        "venv",
        "node_modules",
        ".pyre",
        ".pytype",
    }
)
MIN_NEEDLE_LEN = 10
# A line this common in Python code is no evidence on its own.
_IMPORT = re.compile(
    r"^(import\s|from\s+\S+\s+import\s|if __name__ == |if TYPE_CHECKING:|raise "
    r"NotImplementedError|super\(\)\.__init__\()"
)
_GENERIC = re.compile(
    r"^(return|pass|else:|try:|finally:|raise|continue|break|yield|\)|\]|\}|\"\"\"|'''|#)"
    r"(\s*(None|True|False|self|cls|result|value|key|\w{1,3}))?[\s:,)\]}]*$"
)


@dataclass(frozen=True)
class PatchedFile:
    """One file of a unified diff: ``added``/``removed`` lines per hunk."""

    path: str
    hunks: tuple[tuple[int, tuple[str, ...]], ...]  # (old start line, lines with ' ', '+', '-' prefixes)
    new_file: bool = False
    deleted_file: bool = False


def parse_patch(text: str) -> list[PatchedFile]:
    """Parse a git-style unified diff (the gold patch) into files and hunks."""
    files: list[PatchedFile] = []
    path: str | None = None
    new = deleted = False
    hunks: list[tuple[int, list[str]]] = []

    def flush() -> None:
        if path is not None:
            files.append(
                PatchedFile(
                    path=path,
                    hunks=tuple((s, tuple(h)) for s, h in hunks),
                    new_file=new,
                    deleted_file=deleted,
                )
            )

    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("diff --git "):
            flush()
            path, new, deleted, hunks = None, False, False, []
        elif line.startswith("new file mode"):
            new = True
        elif line.startswith("deleted file mode"):
            deleted = True
        elif line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            if path is not None and hunks:  # a plain diff with several files and no 'diff --git' lines
                flush()
                hunks = []
            old, newp = line[4:].split("\t")[0], lines[i + 1][4:].split("\t")[0]
            new = new or old == "/dev/null"
            deleted = deleted or newp == "/dev/null"
            chosen = newp if newp != "/dev/null" else old
            path = chosen[2:] if chosen[:2] in ("a/", "b/") else chosen
            i += 1
        elif line.startswith("@@") and path is not None:
            m = re.match(r"@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@", line)
            hunks.append((int(m.group(1)) if m else 1, []))
        elif hunks and line[:1] in (" ", "+", "-", ""):
            hunks[-1][1].append(line if line else " ")
        i += 1
    flush()
    return files


def apply_hunks(post: str, pf: PatchedFile) -> str:
    """Rebuild the original text: the gold patch turns the post-deletion file back into it."""
    if pf.deleted_file:
        return ""
    src = [] if pf.new_file else post.splitlines()
    out: list[str] = []
    pos = 0
    for start, body in pf.hunks:
        old_lines = [ln[1:] for ln in body if ln[0] in " -"]
        at = max(start - 1, 0) if old_lines else start
        at = _locate(src, old_lines, at)
        out.extend(src[pos:at])
        out.extend(ln[1:] for ln in body if ln[0] in " +")
        pos = at + len(old_lines)
    out.extend(src[pos:])
    return "\n".join(out) + ("\n" if out else "")


def _locate(src: list[str], old: list[str], guess: int) -> int:
    if not old or src[guess : guess + len(old)] == old:
        return guess
    for delta in range(1, len(src) + 1):
        for at in (guess - delta, guess + delta):
            if 0 <= at <= len(src) - len(old) and src[at : at + len(old)] == old:
                return at
    return guess


@dataclass(kw_only=True)
class Secret:
    """Fingerprints of one task's deleted code."""

    task_id: str
    needles: frozenset[str]
    codes: frozenset[tuple[str, bytes]] = frozenset()
    removed_names: frozenset[tuple[str, str]] = frozenset()  # (module file stem, qualname)
    docstring_lines: frozenset[str] = frozenset()  # needles that come from removed docstrings
    signature_lines: frozenset[str] = frozenset()  # needles that are def/class header lines
    removed_files: frozenset[str] = frozenset()  # workspace-relative .py files deleted whole
    patched_files: frozenset[str] = frozenset()  # workspace-relative .py files the gold patch touches
    candidates: frozenset[str] = field(default=frozenset(), repr=False)

    @property
    def empty(self) -> bool:
        return not (self.needles or self.codes or self.removed_names)


def iter_source_files(root: Path, suffix: str = ".py") -> Iterator[Path]:
    """Files under ``root`` with ``suffix``, skipping caches, builds, VCS and env dirs."""
    for path in sorted(root.rglob(f"*{suffix}")):
        rel = path.relative_to(root).parts
        if any(p in JUNK_DIRS or p.endswith((".egg-info", ".dist-info")) for p in rel[:-1]):
            continue
        if path.is_file() and not path.is_symlink():
            yield path


#: Names so common in any Python code that a line made only of them (plus keywords and builtins)
#: occurs in third-party packages of every environment (``except AttributeError:``) and proves nothing.
_COMMON_NAMES = frozenset(
    [
        "self",
        "cls",
        "args",
        "kwargs",
        "result",
        "results",
        "value",
        "values",
        "key",
        "keys",
        "other",
        "obj",
        "item",
        "items",
        "name",
        "data",
        "e",
        "exc",
        "err",
        "error",
        "msg",
        "x",
        "y",
        "i",
        "j",
        "k",
        "n",
        "func",
        "fn",
        "default",
        "__name__",
    ]
)
_NAMES_OK = (
    frozenset(keyword.kwlist) | frozenset(keyword.softkwlist) | frozenset(dir(builtins)) | _COMMON_NAMES
)
_WORD = re.compile(r"[A-Za-z_]\w*")
_LITERAL = re.compile(r"([\'\"])(?:(?!\1).){3,}\1|\d{3,}")


def is_generic(line: str) -> bool:
    """Whether ``line`` uses only keywords, builtins and very common names, and no literal: no evidence."""
    if _LITERAL.search(line):
        return False
    return all(w in _NAMES_OK for w in _WORD.findall(line))


def candidate_lines(added: Iterable[str]) -> set[str]:
    """Stripped added lines long and specific enough to identify the deleted code."""
    out = set()
    for line in added:
        s = line.strip()
        if (
            len(s) >= MIN_NEEDLE_LEN
            and re.search(r"[A-Za-z0-9]", s)
            and not _GENERIC.match(s)
            and not _IMPORT.match(s)
            and not is_generic(s)
        ):
            out.add(s)
    return out


def derive_secret(task_id: str, workspace: Path, patch_text: str) -> Secret:
    """Fingerprints of the code ``patch_text`` restores into ``workspace``.

    A line counts as a needle only if no reference source file (the workspace's Python code,
    leak dirs excluded) still contains it; a file holding at least half of the candidate lines is
    itself a copy of the deleted code and is not used as reference.
    """
    workspace = Path(workspace)
    files = parse_patch(patch_text)
    added: list[str] = []
    codes: set[tuple[str, bytes]] = set()
    names: set[tuple[str, str]] = set()
    docs: set[str] = set()
    patched: set[Path] = set()
    removed_files: set[str] = set()
    patched_rel: set[str] = set()
    headers: set[str] = set()
    for pf in files:
        added.extend(ln[1:] for _, body in pf.hunks for ln in body if ln[0] == "+")
        if not pf.path.endswith(".py"):
            continue
        if pf.new_file:
            removed_files.add(pf.path)
        patched_rel.add(pf.path)
        target = workspace / pf.path
        patched.add(target.resolve())
        post = target.read_text(errors="replace") if target.is_file() and not pf.new_file else ""
        original = apply_hunks(post, pf)
        codes |= _code_fingerprints(original, pf.path) - _code_fingerprints(post, pf.path)
        stem = Path(pf.path).stem
        names |= {(stem, q) for q in _defined_names(original) - _defined_names(post)}
        docs |= _docstring_lines(original) - _docstring_lines(post)
        headers |= _header_lines(original) - _header_lines(post)
    cands = candidate_lines(added)
    common: set[str] = set()
    if cands:
        for path in iter_source_files(workspace):
            try:
                lines = {ln.strip() for ln in path.read_text(errors="replace").splitlines()}
            except OSError:
                continue
            hits = cands & lines
            if path.resolve() not in patched and len(cands) >= 3 and len(hits) * 2 >= len(cands):
                continue  # a copy of the deleted code elsewhere, not reference material
            common |= hits
    needles = frozenset(cands - common)
    return Secret(
        task_id=task_id,
        needles=needles,
        codes=frozenset(codes),
        removed_names=frozenset(names),
        docstring_lines=needles & frozenset(docs),
        signature_lines=needles & frozenset(headers),
        removed_files=frozenset(removed_files),
        patched_files=frozenset(patched_rel),
        candidates=frozenset(cands),
    )


def _docstring_lines(source: str) -> set[str]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Module):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                out |= {ln.strip() for ln in doc.splitlines() if ln.strip()}
    return out


def _header_lines(source: str) -> set[str]:
    """Lines of def/class headers (decorators through the colon), however they are wrapped."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()
    lines = source.splitlines()
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.body:
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            end = max(node.body[0].lineno - 1, node.lineno)
            out |= {ln.strip() for ln in lines[start - 1 : end] if ln.strip()}
    return out


def _walk_code(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _walk_code(const)


def code_key(code: types.CodeType) -> tuple[str, bytes]:
    """Identity of a compiled definition independent of file name and line numbers."""
    return (code.co_qualname, code.co_code + repr((code.co_names, code.co_varnames)).encode())


def _code_fingerprints(source: str, filename: str) -> set[tuple[str, bytes]]:
    if not source.strip():
        return set()
    try:
        module = compile(source, filename, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return set()
    return {code_key(c) for c in _walk_code(module) if c.co_name != "<module>"}


def _defined_names(source: str) -> set[str]:
    """Qualified names of the functions and classes ``source`` defines."""
    return set(stub_definitions(source))


def stub_definitions(source: str) -> dict[str, list[tuple[int, int]]]:
    """Qualified names defined in a ``.pyi`` (or ``.py``) file and their line spans (1-based).

    A name can have several spans (``@overload`` variants, conditional definitions).
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return {}
    out: dict[str, list[tuple[int, int]]] = {}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                out.setdefault(prefix + node.name, []).append((start, node.end_lineno or node.lineno))
                if isinstance(node, ast.ClassDef):
                    visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, ast.If | ast.Try):
                visit(node.body, prefix)
                visit(getattr(node, "orelse", []), prefix)

    visit(tree.body, "")
    return out
