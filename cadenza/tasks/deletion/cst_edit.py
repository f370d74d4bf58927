"""libcst building blocks of feature deletion: parse (memoised), find a definition, replace or drop it,
and the transformers that repair what a removal would break at import time (``__all__`` entries,
aliases, re-exports, ``from . import mod``)."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import libcst as cst


class DeletionError(Exception):
    """The candidate cannot be deleted at this level (trivial body, ambiguous name, parse error)."""


@functools.lru_cache(maxsize=128)
def parse_module(text: str) -> cst.Module:
    """libcst parse, memoised: candidates of one source re-read the same modules (trees are immutable)."""
    return cst.parse_module(text)


def docstring_stmt(body: Sequence[cst.BaseStatement]) -> cst.SimpleStatementLine | None:
    if body and isinstance(body[0], cst.SimpleStatementLine) and len(body[0].body) == 1:
        expr = body[0].body[0]
        if isinstance(expr, cst.Expr) and isinstance(expr.value, (cst.SimpleString, cst.ConcatenatedString)):
            return body[0]
    return None


def docstring_text(node: cst.FunctionDef | cst.ClassDef | cst.Module) -> str | None:
    value = node.get_docstring(clean=True)
    return value or None


def header_code(module: cst.Module, node: cst.FunctionDef | cst.ClassDef) -> str:
    """Decorators + ``def``/``class`` line(s), without the body."""
    stub = node.with_changes(body=cst.SimpleStatementSuite(body=[cst.Expr(cst.Ellipsis())]), leading_lines=[])
    code = module.code_for_node(stub).rstrip()
    return code[: -len(": ...")] + ":" if code.endswith(": ...") else code


def is_trivial(body: Sequence[cst.BaseStatement]) -> bool:
    """Body is empty, ``pass``, ``...`` or already raises NotImplementedError."""
    stmts = [s for i, s in enumerate(body) if not (i == 0 and docstring_stmt(body) is s)]
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


def find_definition(body: Sequence[cst.BaseStatement], parts: list[str]) -> cst.FunctionDef | cst.ClassDef:
    matches = [s for s in body if isinstance(s, (cst.FunctionDef, cst.ClassDef)) and s.name.value == parts[0]]
    if len(matches) != 1:
        raise DeletionError(f"{'.'.join(parts)}: {len(matches)} definitions with that name at this level")
    node = matches[0]
    if len(parts) == 1:
        return node
    if not isinstance(node, cst.ClassDef) or not isinstance(node.body, cst.IndentedBlock):
        raise DeletionError(f"{parts[0]} is not a class with a block body")
    return find_definition(node.body.body, parts[1:])


def replace_definition(
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
            inner = replace_definition(stmt.body.body, parts[1:], new)
            if not inner:
                inner = [cst.SimpleStatementLine(body=[cst.Pass()])]
            out.append(stmt.with_changes(body=stmt.body.with_changes(body=inner)))
        else:
            out.append(stmt)
    return out


def pass_if_empty(body: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
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


class ImportFixup(cst.CSTTransformer):
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
        return updated.with_changes(body=pass_if_empty(list(updated.body)))

    def leave_SimpleStatementLine(self, original, updated):
        if not updated.body:
            return cst.RemovalSentinel.REMOVE
        return updated


def _alias_local(alias: cst.ImportAlias) -> str:
    if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
        return alias.asname.name.value
    return _dotted(alias.name).split(".")[0]


class ClassAliasFixup(cst.CSTTransformer):
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
        return updated.with_changes(body=updated.body.with_changes(body=pass_if_empty(out)))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False
