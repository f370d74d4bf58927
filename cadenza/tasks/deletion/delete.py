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
import stat
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

from cadenza.tasks.deletion.cst_edit import (
    ClassAliasFixup,
    DeletionError,
    ImportFixup,
    docstring_stmt,
    docstring_text,
    find_definition,
    header_code,
    is_trivial,
    parse_module,
    pass_if_empty,
    replace_definition,
    resolve_import,
)
from cadenza.tasks.deletion.features import Candidate
from cadenza.tasks.deletion.snippets import removed_snippets, site_lines, unified_patch

__all__ = [
    "Deletion",
    "DeletionError",
    "apply_deletion",
    "plan_deletion",
    "removed_snippets",
    "resolve_import",
    "site_lines",
]


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
        tree = parse_module(original_text)
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
        docstring = docstring_text(tree)
        signature = f"module {cand.module}"
        api = _public_api(tree)
    else:
        node = find_definition(tree.body, parts)
        docstring = docstring_text(node)
        signature = header_code(tree, node)
        if level == 1:
            if not isinstance(node, cst.FunctionDef):
                raise DeletionError("level 1 stubs functions and methods only")
            body = node.body.body
            if is_trivial(body):
                raise DeletionError("body is already trivial")
            doc = docstring_stmt(body) if isinstance(node.body, cst.IndentedBlock) else None
            raise_line = cst.SimpleStatementLine(body=[cst.Raise(exc=cst.Name("NotImplementedError"))])
            if isinstance(node.body, cst.IndentedBlock):
                new_body = node.body.with_changes(body=[doc, raise_line] if doc else [raise_line], footer=[])
            else:
                new_body = cst.IndentedBlock(body=[raise_line])
            kept = [doc] if doc else []
            removed_code = "\n".join(tree.code_for_node(s) for s in body if s not in kept)
            new_tree = tree.with_changes(
                body=replace_definition(tree.body, parts, node.with_changes(body=new_body))
            )
            changed[path] = new_tree.code
        else:
            if level == 2 and cand.kind not in ("function", "method"):
                raise DeletionError("level 2 removes functions and methods; classes are level 3")
            if level == 3 and cand.kind != "class":
                raise DeletionError("level 3 removes classes and modules")
            removed_code = tree.code_for_node(node)
            if cand.kind == "class":
                api = _public_api(node)
            new_tree = tree.with_changes(body=pass_if_empty(replace_definition(tree.body, parts, None)))
            if len(parts) > 1:
                new_tree = new_tree.visit(ClassAliasFixup(parts[:-1], parts[-1]))
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
                tree = parse_module(text)
            except cst.ParserSyntaxError:
                continue
            fix = ImportFixup(
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
            doc = docstring_text(stmt)
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
