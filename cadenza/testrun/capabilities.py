"""Process-level capabilities a Python source uses, found by its syntax with aliases resolved.

Code under test reaches the verdict only through the process: frames and closures, ``gc`` walks,
``ctypes``, tracing, import hooks and ``sys.modules``, ``builtins``, exits and signals, subprocesses,
raw descriptors, code objects, attributes set on classes or modules it did not define, the test
runner's own packages, a source encoding that shows a parser other text than the interpreter sees.
Ordinary code (helpers, modules, value classes, refactors) uses none of them, so a capability that the
pristine file or package never used is evidence in itself (:func:`new_capabilities`).

Names are resolved, not matched: ``import sys as s; g = s._getframe``, ``from sys import _getframe``,
``getattr(sys, "_getframe")`` all count as ``sys._getframe``; a computed attribute name on a module
(``getattr(sys, "mod" + "ules")``) or any ``__import__``/``import_module`` of a computed name is a
capability of its own. Source is decoded with its declared encoding before any analysis; a file that
cannot be decoded or parsed, or is too large to read, is a finding too (fail closed).
"""

from __future__ import annotations

import ast
import hashlib
import io
import tokenize
from dataclasses import dataclass

from cadenza.testrun.capability_names import (
    ATTRS,
    CALLS,
    DYNAMIC_IMPORTS,
    GUARD_KINDS,
    KIND_TEXT,
    MAX_SOURCE_BYTES,
    METADATA_DUNDERS,
    NAMES,
    PREFIX_NAMES,
    REROOT,
    UTF8_NAMES,
)

__all__ = [
    "GUARD_KINDS",
    "KIND_TEXT",
    "MAX_SOURCE_BYTES",
    "Finding",
    "Use",
    "kinds",
    "new_capabilities",
    "scan",
]


@dataclass(frozen=True)
class Use:
    kind: str
    line: int
    what: str


def _decode(source: bytes) -> tuple[str | None, list[Use]]:
    if len(source) > MAX_SOURCE_BYTES:
        return None, [Use("unreadable", 0, f"{len(source)} bytes, over the {MAX_SOURCE_BYTES}-byte limit")]
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
    except SyntaxError as e:
        return None, [Use("unreadable", 1, f"bad encoding declaration: {e}")]
    uses = []
    if encoding.lower().replace("_", "-") not in UTF8_NAMES:
        uses.append(Use("encoding", 1, f"coding: {encoding}"))
    try:
        return source.decode(encoding), uses
    except (UnicodeDecodeError, LookupError) as e:
        return None, [*uses, Use("unreadable", 1, f"does not decode as {encoding}: {e}")]


class _Scanner(ast.NodeVisitor):
    def __init__(self) -> None:
        self.alias: dict[str, str] = {}  # local name -> dotted module path it stands for
        self.classes: set[str] = set()
        self.uses: list[Use] = []

    def add(self, kind: str, node: ast.AST, what: str) -> None:
        self.uses.append(Use(kind, getattr(node, "lineno", 0), what))

    def dotted(self, node: ast.AST) -> str | None:
        """``node`` as a dotted path with aliases resolved (``s._getframe`` -> ``sys._getframe``)."""
        if isinstance(node, ast.Name):
            return self.alias.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.dotted(node.value)
            if base and node.attr in REROOT:
                return node.attr  # a module re-exported by another (``os.sys``, ``inspect.types``)
            return f"{base}.{node.attr}" if base else None
        if isinstance(node, ast.Call) and _is_name(node.func, "getattr") and len(node.args) >= 2:
            base, name = self.dotted(node.args[0]), _const_str(node.args[1])
            return f"{base}.{name}" if base and name else None
        return None

    def check_name(self, path: str | None, node: ast.AST) -> None:
        if not path:
            return
        kind = NAMES.get(path) or next((NAMES[p] for p in PREFIX_NAMES if path.startswith(p)), None)
        if kind is None and "." in path and NAMES.get(path.split(".", 1)[0]) in ("ctypes", "runner"):
            kind = NAMES[path.split(".", 1)[0]]
        if kind:
            self.add(kind, node, path)

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self.check_name(a.name, node)
            if a.asname:
                self.alias[a.asname] = a.name
            else:
                top = a.name.split(".", 1)[0]
                self.alias[top] = top

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        mod = node.module or ""
        if node.level == 0:
            self.check_name(mod, node)
        for a in node.names:
            full = f"{mod}.{a.name}" if node.level == 0 else None
            if full:
                self.check_name(full, node)
                self.alias[a.asname or a.name] = full

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if node.name.startswith("pytest_"):
            self.add("runner", node, f"defines the pytest hook {node.name}")
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.classes.add(node.name)
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        path = self.dotted(node.value)
        for t in node.targets:
            self.store(t)
            if isinstance(t, ast.Name) and path:
                self.alias[t.id] = path
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.store(node.target)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.store(node.target)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for t in node.targets:
            self.store(t)
        self.generic_visit(node)

    def store(self, target: ast.AST) -> None:
        """An attribute written: on an imported module or name, or a dunder on anything."""
        if not isinstance(target, ast.Attribute):
            return
        owner = self.dotted(target.value)
        text = f"{ast.unparse(target.value)}.{target.attr}"
        if owner is not None:
            self.add("foreign_patch", target, f"assigns {owner}.{target.attr}")
        elif _dunder(target.attr) and target.attr not in METADATA_DUNDERS:
            self.add("foreign_patch", target, f"assigns {text}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        kind = ATTRS.get(node.attr)
        if kind:
            self.add(kind, node, f".{node.attr}")
        if node.attr == "__dict__" and self.dotted(node.value) is not None:
            self.add("reflection", node, f"{self.dotted(node.value)}.__dict__")
        self.check_name(self.dotted(node), node)
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id == "__builtins__":
            self.add("builtins", node, "__builtins__")
        elif node.id in ("__import__",):
            self.add("import_hooks", node, node.id)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id in CALLS and func.id not in self.alias:
            self.add(CALLS[func.id], node, f"{func.id}()")
        path = self.dotted(func) or (func.id if isinstance(func, ast.Name) else None)
        if path in DYNAMIC_IMPORTS and node.args and _const_str(node.args[0]) is None:
            self.add("import_hooks", node, f"{path}() of a computed name")
        elif path in DYNAMIC_IMPORTS and node.args:
            self.check_name(_const_str(node.args[0]), node)
        if isinstance(func, ast.Name) and func.id in ("getattr", "setattr", "delattr", "hasattr"):
            self.reflective(func.id, node)
        if path in ("object.__setattr__", "type.__setattr__", "object.__delattr__", "type.__delattr__"):
            self.add("foreign_patch", node, f"{path}()")
        if _is_name(func, "vars") and node.args and self.dotted(node.args[0]) is not None:
            self.add("reflection", node, f"vars({self.dotted(node.args[0])})")
        self.generic_visit(node)

    def reflective(self, fn: str, node: ast.Call) -> None:
        if len(node.args) < 2:
            return
        owner, name = self.dotted(node.args[0]), _const_str(node.args[1])
        if name is None and owner is not None:
            self.add("reflection", node, f"{fn}() of a computed name on {owner}")
        elif name is None and not _safe_prefix(node.args[1]):
            if fn == "setattr":
                self.add("foreign_patch", node, "setattr() of a computed name")
        elif name is not None:
            kind = ATTRS.get(name)
            if kind:
                self.add(kind, node, f"{fn}(..., {name!r})")
            if fn in ("setattr", "delattr") and (owner is not None or _dunder(name)):
                self.add("foreign_patch", node, f"{fn}({owner or ast.unparse(node.args[0])}, {name!r})")
            if owner is not None:
                self.check_name(f"{owner}.{name}", node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.ctx, (ast.Store, ast.Del)) and isinstance(node.value, ast.Call):
            func = node.value.func
            if isinstance(func, ast.Name) and func.id in ("vars", "globals", "locals"):
                self.add("reflection", node, f"writes through {func.id}()")
        store = isinstance(node.ctx, (ast.Store, ast.Del))
        if store and self.dotted(node.value) == "sys.path":
            self.add("import_hooks", node, "writes into sys.path")
        if store and isinstance(node.value, ast.Attribute) and node.value.attr == "__dict__":
            self.add("reflection", node, "writes into a __dict__")
        self.generic_visit(node)


def _is_name(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _const_str(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__") and len(name) > 4


def _safe_prefix(node: ast.AST) -> bool:
    """A computed name starting with a literal letter (``f"visit_{x}"``, ``"get_" + x``): never a dunder."""
    first = None
    if isinstance(node, ast.JoinedStr) and node.values:
        first = _const_str(node.values[0])
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        first = _const_str(node.left)
    return bool(first) and not first.startswith("_")


def scan(source: bytes) -> list[Use]:
    """Every capability ``source`` uses (see module docstring)."""
    text, uses = _decode(source)
    if text is None:
        return uses
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError) as e:
        return [*uses, Use("unreadable", getattr(e, "lineno", 0) or 0, f"does not parse: {e.msg}")]
    scanner = _Scanner()
    scanner.visit(tree)
    return [*uses, *scanner.uses]


_CACHE: dict[bytes, frozenset[str]] = {}


def kinds(source: bytes) -> frozenset[str]:
    """The capability kinds ``source`` uses (memoised by content)."""
    digest = hashlib.sha256(source).digest()
    got = _CACHE.get(digest)
    if got is None:
        got = _CACHE[digest] = frozenset(u.kind for u in scan(source))
        if len(_CACHE) > 50_000:
            _CACHE.clear()
    return got


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    kind: str
    what: str

    def __str__(self) -> str:
        head = f"{self.path}:{self.line}: {KIND_TEXT.get(self.kind, self.kind)} ({self.what})"
        return head if self.kind == "unreadable" else f"{head}, which the original file and package never use"


def new_capabilities(
    changed: dict[str, bytes], pristine: dict[str, bytes], package_kinds: frozenset[str]
) -> list[Finding]:
    """Capabilities in the agent's ``changed`` Python files (workspace path -> bytes) that neither the
    pristine version of that file (``pristine``, absent for a new file) nor the pristine package uses.
    ``encoding`` and ``unreadable`` findings are never excused by the package."""
    found = []
    package = package_kinds - {"encoding", "unreadable"}
    for rel, data in sorted(changed.items()):
        allowed = package | ((kinds(pristine[rel]) - {"unreadable"}) if rel in pristine else frozenset())
        seen: set[tuple[str, int]] = set()
        for use in scan(data):
            if use.kind in allowed or (use.kind, use.line) in seen:
                continue
            seen.add((use.kind, use.line))
            found.append(Finding(rel, use.line, use.kind, use.what))
    return found


def visible_allowances(files: dict[str, bytes]) -> dict[str, list[str]]:
    """Workspace path -> the guard's kinds that file may use (the ones its source visibly uses)."""
    out = {}
    for rel, data in files.items():
        allowed = sorted({GUARD_KINDS[k] for k in kinds(data) if k in GUARD_KINDS})
        if allowed:
            out[rel] = allowed
    return out
