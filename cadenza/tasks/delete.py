"""Feature deletion with libcst: formatting and comments of untouched code survive byte for byte.

Levels:

1. the body of a function/method becomes ``raise NotImplementedError`` (decorators, signature
   and docstring stay);
2. a function/method is removed entirely, plus whatever would break import: its ``__all__``
   entries, aliases (``x = func``) and re-exports (``from .mod import func``) in other modules of
   the package, followed transitively;
3. a cluster: a whole class (with its methods) or a whole module file, with the same import
   fix-ups (``from . import mod``, ``from .mod import a, b``, ``import pkg.mod``).

:func:`plan_deletion` computes the new file texts without touching disk; :func:`apply_deletion`
writes them. The :class:`Deletion` carries the gold patch (restores the original, applies with
``git apply`` inside the workspace) and the removed snippets a leak scanner searches for.
"""

from __future__ import annotations

import ast
import difflib
import functools
import re
import stat
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

from cadenza.tasks.features import Candidate


class DeletionError(Exception):
    """The candidate cannot be deleted at this level (trivial body, ambiguous name, parse error)."""


@dataclass(kw_only=True)
class Deletion:
    """The result of deleting one feature.

    ``changed`` maps workspace-relative paths to new text (``None``: file deleted); ``original``
    holds the previous text of each. ``signature`` is the definition header (decorators + def/class
    line) and ``docstring`` its docstring; ``api`` lists signatures of public members (classes and
    modules) for the statement.
    """

    level: int
    candidate: Candidate
    changed: dict[str, str | None]
    original: dict[str, str]
    gold_patch: str
    removed_code: str
    removed_snippets: list[str]
    signature: str
    docstring: str | None
    api: list[str] = field(default_factory=list)
    removed_names: dict[str, list[str]] = field(default_factory=dict)


# ----------------------------------------------------------------------------- helpers


@functools.lru_cache(maxsize=128)
def _parse(text: str) -> cst.Module:
    """libcst parse, memoised: candidates of one source re-read the same modules (trees are immutable)."""
    return cst.parse_module(text)


def _docstring_stmt(body: Sequence[cst.BaseStatement]) -> cst.SimpleStatementLine | None:
    if body and isinstance(body[0], cst.SimpleStatementLine) and len(body[0].body) == 1:
        expr = body[0].body[0]
        if isinstance(expr, cst.Expr) and isinstance(expr.value, (cst.SimpleString, cst.ConcatenatedString)):
            return body[0]
    return None


def _docstring_text(node: cst.FunctionDef | cst.ClassDef | cst.Module) -> str | None:
    value = node.get_docstring(clean=True)
    return value or None


def header_code(module: cst.Module, node: cst.FunctionDef | cst.ClassDef) -> str:
    """Decorators + ``def``/``class`` line(s), without the body."""
    stub = node.with_changes(body=cst.SimpleStatementSuite(body=[cst.Expr(cst.Ellipsis())]), leading_lines=[])
    code = module.code_for_node(stub).rstrip()
    return code[: -len(": ...")] + ":" if code.endswith(": ...") else code


def _is_trivial(body: Sequence[cst.BaseStatement]) -> bool:
    """Body is empty, ``pass``, ``...`` or already raises NotImplementedError."""
    stmts = [s for i, s in enumerate(body) if not (i == 0 and _docstring_stmt(body) is s)]
    if not stmts:
        return True
    if len(stmts) > 1:
        return False
    code = cst.Module(body=[]).code_for_node(stmts[0]).strip()
    return code in {
        "pass",
        "...",
        "raise NotImplementedError",
        "raise NotImplementedError()",
    } or code.startswith("raise NotImplementedError(")


def _find(body: Sequence[cst.BaseStatement], parts: list[str]) -> cst.FunctionDef | cst.ClassDef:
    matches = [s for s in body if isinstance(s, (cst.FunctionDef, cst.ClassDef)) and s.name.value == parts[0]]
    if len(matches) != 1:
        raise DeletionError(f"{'.'.join(parts)}: {len(matches)} definitions with that name at this level")
    node = matches[0]
    if len(parts) == 1:
        return node
    if not isinstance(node, cst.ClassDef) or not isinstance(node.body, cst.IndentedBlock):
        raise DeletionError(f"{parts[0]} is not a class with a block body")
    return _find(node.body.body, parts[1:])


def _replace(
    body: Sequence[cst.BaseStatement], parts: list[str], new: cst.BaseStatement | None
) -> list[cst.BaseStatement]:
    """Return ``body`` with the definition at ``parts`` replaced by ``new`` (``None``: removed)."""
    out: list[cst.BaseStatement] = []
    for stmt in body:
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) and stmt.name.value == parts[0]:
            if len(parts) == 1:
                if new is not None:
                    out.append(new)
                continue
            assert isinstance(stmt, cst.ClassDef) and isinstance(stmt.body, cst.IndentedBlock)
            inner = _replace(stmt.body.body, parts[1:], new)
            if not inner:
                inner = [cst.SimpleStatementLine(body=[cst.Pass()])]
            out.append(stmt.with_changes(body=stmt.body.with_changes(body=inner)))
        else:
            out.append(stmt)
    return out


def _pass_if_empty(body: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
    return body or [cst.SimpleStatementLine(body=[cst.Pass()])]


def resolve_import(module: str, is_package: bool, level: int, target: str | None) -> str:
    """Absolute module name of ``from <level dots><target> import ...`` written in ``module``."""
    if level == 0:
        return target or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, target] if target else base)


def _dotted(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return f"{_dotted(node.value)}.{node.attr.value}"
    return ""


def _string_value(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.SimpleString):
        return node.evaluated_value if isinstance(node.evaluated_value, str) else None
    return None


# ----------------------------------------------------------------------------- import fix-ups


class _Fixup(cst.CSTTransformer):
    """Remove module-level references to deleted names so the module still imports.

    ``own_removed`` are names deleted from this module itself; ``removed`` maps other modules to
    their deleted names; ``deleted_modules`` are module files removed entirely. Newly unbound local
    names (aliases, re-exports) are collected in ``unbound``.
    """

    def __init__(
        self,
        module: str,
        is_package: bool,
        own_removed: set[str],
        removed: dict[str, set[str]],
        deleted_modules: set[str],
    ) -> None:
        super().__init__()
        self.module, self.is_package = module, is_package
        self.own_removed = set(own_removed)
        self.removed, self.deleted_modules = removed, deleted_modules
        self.unbound: set[str] = set()
        self.depth = 0

    # Only module level (including if/try blocks) matters for import; skip defs and classes.
    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    def _gone(self, name: str) -> bool:
        return name in self.own_removed or name in self.unbound

    def _module_gone(self, mod: str) -> bool:
        return any(mod == d or mod.startswith(d + ".") for d in self.deleted_modules)

    def leave_ImportFrom(self, original: cst.ImportFrom, updated: cst.ImportFrom):
        target = _dotted(updated.module) if updated.module is not None else None
        level = len(updated.relative)
        mod = resolve_import(self.module, self.is_package, level, target)
        if self._module_gone(mod):
            if not isinstance(updated.names, cst.ImportStar):
                for alias in updated.names:
                    self.unbound.add(_alias_local(alias))
            return cst.RemovalSentinel.REMOVE
        if isinstance(updated.names, cst.ImportStar):
            # ``from mod import *`` re-exported the public names that are now gone.
            self.unbound.update(n for n in self.removed.get(mod, set()) if not n.startswith("_"))
            return updated
        keep = []
        for alias in updated.names:
            name = _dotted(alias.name)
            local = _alias_local(alias)
            if name in self.removed.get(mod, set()) or self._module_gone(f"{mod}.{name}"):
                self.unbound.add(local)
            else:
                keep.append(alias)
        if len(keep) == len(updated.names):
            return updated
        if not keep:
            return cst.RemovalSentinel.REMOVE
        keep[-1] = keep[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated.with_changes(names=keep)

    def leave_Import(self, original: cst.Import, updated: cst.Import):
        keep = [a for a in updated.names if not self._module_gone(_dotted(a.name))]
        if len(keep) == len(updated.names):
            return updated
        for a in updated.names:
            if a not in keep and a.asname is not None:
                self.unbound.add(_alias_local(a))
        if not keep:
            return cst.RemovalSentinel.REMOVE
        keep[-1] = keep[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated.with_changes(names=keep)

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign):
        if isinstance(updated.value, cst.Name) and self._gone(updated.value.value):
            for t in updated.targets:
                if isinstance(t.target, cst.Name):
                    self.unbound.add(t.target.value)
            return cst.RemovalSentinel.REMOVE
        if any(isinstance(t.target, cst.Name) and t.target.value == "__all__" for t in updated.targets):
            return updated.with_changes(value=self._strip_all(updated.value))
        return updated

    def leave_AugAssign(self, original: cst.AugAssign, updated: cst.AugAssign):
        if isinstance(updated.target, cst.Name) and updated.target.value == "__all__":
            return updated.with_changes(value=self._strip_all(updated.value))
        return updated

    def leave_Expr(self, original: cst.Expr, updated: cst.Expr):
        call = updated.value
        if (
            isinstance(call, cst.Call)
            and isinstance(call.func, cst.Attribute)
            and _dotted(call.func.value) == "__all__"
        ):
            if (
                call.func.attr.value == "append"
                and call.args
                and self._gone(_string_value(call.args[0].value) or "")
            ):
                return cst.RemovalSentinel.REMOVE
            if call.func.attr.value == "extend" and call.args:
                return updated.with_changes(
                    value=call.with_changes(
                        args=[call.args[0].with_changes(value=self._strip_all(call.args[0].value))]
                    )
                )
        return updated

    def _strip_all(self, value: cst.BaseExpression) -> cst.BaseExpression:
        if isinstance(value, (cst.List, cst.Tuple, cst.Set)):
            keep = [e for e in value.elements if not self._gone(_string_value(e.value) or "")]
            if len(keep) != len(value.elements):
                if keep:
                    keep[-1] = keep[-1].with_changes(comma=value.elements[-1].comma)
                if len(keep) == 1 and isinstance(value, cst.Tuple):
                    keep[0] = keep[0].with_changes(comma=cst.Comma())  # ("a",) stays a tuple
                if not keep and isinstance(value, cst.Tuple) and not value.lpar:
                    return value.with_changes(elements=[], lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
                return value.with_changes(elements=keep)
        if isinstance(value, cst.BinaryOperation):
            return value.with_changes(left=self._strip_all(value.left), right=self._strip_all(value.right))
        return value

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock):
        return updated.with_changes(body=_pass_if_empty(list(updated.body)))

    def leave_SimpleStatementLine(self, original, updated):
        if not updated.body:
            return cst.RemovalSentinel.REMOVE
        return updated


def _alias_local(alias: cst.ImportAlias) -> str:
    if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
        return alias.asname.name.value
    return _dotted(alias.name).split(".")[0]


class _ClassAliasFixup(cst.CSTTransformer):
    """Inside one class body: drop ``alias = removed_method`` lines (they would raise NameError)."""

    def __init__(self, parts: list[str], name: str) -> None:
        super().__init__()
        self.parts, self.name, self.stack = parts, name, []

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self.stack.append(node.name.value)
        return True

    def leave_ClassDef(self, original, updated):
        here = self.stack == self.parts
        self.stack.pop()
        if not here or not isinstance(updated.body, cst.IndentedBlock):
            return updated
        names = {self.name}
        out = []
        for stmt in updated.body.body:
            if (
                isinstance(stmt, cst.SimpleStatementLine)
                and len(stmt.body) == 1
                and isinstance(stmt.body[0], cst.Assign)
                and isinstance(stmt.body[0].value, cst.Name)
                and stmt.body[0].value.value in names
            ):
                names.update(t.target.value for t in stmt.body[0].targets if isinstance(t.target, cst.Name))
                continue
            out.append(stmt)
        return updated.with_changes(body=updated.body.with_changes(body=_pass_if_empty(out)))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False


# ----------------------------------------------------------------------------- patches and snippets


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


# ----------------------------------------------------------------------------- planning


def _module_map(modules: dict[str, str]) -> dict[str, str]:
    return {mod: path for path, mod in modules.items()}


def plan_deletion(
    root: Path, cand: Candidate, level: int, modules: dict[str, str], *, known_lines: Collection[str] = ()
) -> Deletion:
    """Compute the deletion of ``cand`` at ``level`` in the tree at ``root`` (nothing is written).

    ``modules`` maps root-relative module paths to dotted module names (all non-test modules of
    the project); fix-ups are applied to those only, never to tests. ``known_lines`` are lines that
    never count as removed snippets (see :func:`removed_snippets`).
    """
    root = Path(root)
    path = cand.path
    original_text = (root / path).read_text()
    try:
        tree = _parse(original_text)
    except cst.ParserSyntaxError as exc:
        raise DeletionError(f"{path}: libcst cannot parse it ({exc.message})") from None
    parts = cand.local.split(".") if cand.local else []
    changed: dict[str, str | None] = {}
    removed: dict[str, set[str]] = {}
    deleted_modules: set[str] = set()
    api: list[str] = []
    if cand.kind == "module":
        if level != 3:
            raise DeletionError("a whole module is a level-3 deletion")
        if Path(path).name == "__init__.py":
            raise DeletionError("deleting a package __init__ removes the package")
        changed[path] = None
        deleted_modules.add(cand.module)
        removed_code = original_text
        docstring = _docstring_text(tree)
        signature = f"module {cand.module}"
        api = _public_api(tree)
    else:
        node = _find(tree.body, parts)
        docstring = _docstring_text(node)
        signature = header_code(tree, node)
        if level == 1:
            if not isinstance(node, cst.FunctionDef):
                raise DeletionError("level 1 stubs functions and methods only")
            body = node.body.body
            if _is_trivial(body):
                raise DeletionError("body is already trivial")
            doc = _docstring_stmt(body) if isinstance(node.body, cst.IndentedBlock) else None
            raise_line = cst.SimpleStatementLine(body=[cst.Raise(exc=cst.Name("NotImplementedError"))])
            if isinstance(node.body, cst.IndentedBlock):
                new_body = node.body.with_changes(body=[doc, raise_line] if doc else [raise_line], footer=[])
            else:
                new_body = cst.IndentedBlock(body=[raise_line])
            kept = [doc] if doc else []
            removed_code = "\n".join(tree.code_for_node(s) for s in body if s not in kept)
            new_tree = tree.with_changes(body=_replace(tree.body, parts, node.with_changes(body=new_body)))
            changed[path] = new_tree.code
        else:
            if level == 2 and cand.kind not in ("function", "method"):
                raise DeletionError("level 2 removes functions and methods; classes are level 3")
            if level == 3 and cand.kind != "class":
                raise DeletionError("level 3 removes classes and modules")
            removed_code = tree.code_for_node(node)
            if cand.kind == "class":
                api = _public_api(node)
            new_tree = tree.with_changes(body=_pass_if_empty(_replace(tree.body, parts, None)))
            if len(parts) > 1:
                new_tree = new_tree.visit(_ClassAliasFixup(parts[:-1], parts[-1]))
            else:
                removed[cand.module] = {parts[0]}
            changed[path] = new_tree.code
    if removed or deleted_modules:
        _propagate(root, modules, changed, removed, deleted_modules)
    before = {p: (root / p).read_text() for p in changed}
    for p, text in changed.items():
        if text is not None:
            try:
                ast.parse(text)
            except SyntaxError as exc:  # pragma: no cover - an internal invariant
                raise DeletionError(f"{p}: deletion produced invalid code ({exc.msg})") from None
    changed = {p: t for p, t in changed.items() if t != before[p]}
    _check_import_time_uses(changed, modules, removed, parts if cand.kind == "method" else None)
    modes = {p: stat.S_IMODE((root / p).stat().st_mode) | 0o100000 for p in changed}
    gold = unified_patch(((p, changed[p], before[p]) for p in changed), modes)
    remaining = _remaining_texts(root, changed)
    return Deletion(
        level=level,
        candidate=cand,
        changed=changed,
        original=before,
        gold_patch=gold,
        removed_code=removed_code,
        removed_snippets=removed_snippets(removed_code, docstring, remaining, known_lines=known_lines),
        signature=signature,
        docstring=docstring,
        api=api,
        removed_names={k: sorted(v) for k, v in removed.items()},
    )


def _propagate(
    root: Path,
    modules: dict[str, str],
    changed: dict[str, str | None],
    removed: dict[str, set[str]],
    deleted_modules: set[str],
) -> None:
    """Fix imports across the package until no module gains a newly unbound name (a fixpoint)."""
    mod_paths = _module_map(modules)
    for _ in range(10):
        grew = False
        for mod, path in sorted(mod_paths.items()):
            if path in changed and changed[path] is None:
                continue
            text = changed.get(path)
            if text is None:
                text = (root / path).read_text()
            words = {n for names in removed.values() for n in names} | {
                m.rsplit(".", 1)[-1] for m in deleted_modules
            }
            if not removed.get(mod) and "import *" not in text and not any(w in text for w in words):
                continue  # cannot reference anything that is gone: skip the (slow) libcst parse
            try:
                tree = _parse(text)
            except cst.ParserSyntaxError:
                continue
            fix = _Fixup(
                mod, Path(path).name == "__init__.py", removed.get(mod, set()), removed, deleted_modules
            )
            new = tree.visit(fix)
            if new.code != text:
                changed[path] = new.code
            new_names = fix.unbound - removed.get(mod, set())
            if new_names:
                removed.setdefault(mod, set()).update(new_names)
                grew = True
        if not grew:
            return


class _ImportTimeNames(ast.NodeVisitor):
    """Names loaded while a module (or one class body) executes: skips function bodies and lambdas.

    Annotations count unless the module has ``from __future__ import annotations`` (then they are
    strings that never run).
    """

    def __init__(self, lazy_annotations: bool = False) -> None:
        self.loaded: set[str] = set()
        self.lazy = lazy_annotations

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self.loaded.add(node.id)

    def _visit_def(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for d in node.decorator_list:
            self.visit(d)
        self.visit(node.args)  # defaults (and annotations) run at definition time
        if node.returns is not None and not self.lazy:
            self.visit(node.returns)

    visit_FunctionDef = _visit_def
    visit_AsyncFunctionDef = _visit_def

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self.visit(node.args)

    def visit_arguments(self, node: ast.arguments) -> None:
        for d in [*node.defaults, *node.kw_defaults]:
            if d is not None:
                self.visit(d)
        if not self.lazy:
            for a in [*node.posonlyargs, *node.args, *node.kwonlyargs, node.vararg, node.kwarg]:
                if a is not None and a.annotation is not None:
                    self.visit(a.annotation)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if not self.lazy:
            self.visit(node.annotation)
        if node.value is not None:
            self.visit(node.value)


def _lazy_annotations(tree: ast.Module) -> bool:
    return any(
        isinstance(n, ast.ImportFrom)
        and n.module == "__future__"
        and any(a.name == "annotations" for a in n.names)
        for n in tree.body
    )


def _check_import_time_uses(
    changed: dict[str, str | None],
    modules: dict[str, str],
    removed: dict[str, set[str]],
    method_parts: list[str] | None,
) -> None:
    """Refuse a deletion whose removed names are still needed while modules import (a cheap pre-filter)."""
    for path, text in changed.items():
        if text is None or path not in modules:
            continue
        tree = ast.parse(text)
        if method_parts is not None:
            node: ast.AST | None = tree
            for name in method_parts[:-1]:
                node = next(
                    (n for n in getattr(node, "body", []) if isinstance(n, ast.ClassDef) and n.name == name),
                    None,
                )
            if node is None:
                continue
            visitor = _ImportTimeNames(_lazy_annotations(tree))
            for stmt in node.body:  # type: ignore[attr-defined]
                visitor.visit(stmt)
            if method_parts[-1] in visitor.loaded:
                raise DeletionError(f"{method_parts[-1]} is still used in its class body")
            continue
        gone = removed.get(modules[path], set())
        visitor = _ImportTimeNames(_lazy_annotations(tree))
        visitor.visit(tree)
        used = sorted(gone & visitor.loaded)
        if used:
            raise DeletionError(f"{modules[path]} still uses {', '.join(used)} at import time")


def _remaining_texts(root: Path, changed: dict[str, str | None]) -> list[str]:
    texts = [t for t in changed.values() if t is not None]
    for p in root.rglob("*"):
        rel = p.relative_to(root).as_posix()
        if rel in changed or not p.is_file() or p.suffix not in {".py", ".pyi"}:
            continue
        try:
            texts.append(p.read_text())
        except (UnicodeDecodeError, OSError):
            continue
    return texts


def _public_api(node: cst.Module | cst.ClassDef) -> list[str]:
    """Header lines (with the first docstring line) of public defs directly in a module or class."""
    body = (
        node.body
        if isinstance(node, cst.Module)
        else (node.body.body if isinstance(node.body, cst.IndentedBlock) else [])
    )
    mod = cst.Module(body=[])
    out = []
    for stmt in body:
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            name = stmt.name.value
            if name.startswith("_") and not (name.startswith("__") and name.endswith("__")):
                continue
            head = header_code(mod, stmt)
            doc = _docstring_text(stmt)
            out.append(head + (f"  # {doc.splitlines()[0]}" if doc else ""))
    return out


def apply_deletion(workspace: Path, deletion: Deletion) -> None:
    """Write the deletion into ``workspace`` (a copy of the tree it was planned on)."""
    for rel, text in deletion.changed.items():
        target = Path(workspace) / rel
        if text is None:
            target.unlink()
        else:
            target.write_text(text)


def site_lines(site_packages: Path) -> frozenset[str]:
    """Stripped lines of every ``.py`` file under ``site_packages`` (what an env-wide scan would see)."""
    lines: set[str] = set()
    for p in Path(site_packages).rglob("*.py"):
        try:
            lines.update(ln.strip() for ln in p.read_text(errors="replace").splitlines())
        except OSError:
            continue
    return frozenset(lines)
