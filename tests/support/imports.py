"""The import graph of a source tree, from the AST (no module is executed): what the layering and
no-circle tests of ``tests/unit/test_architecture.py`` read."""

from __future__ import annotations

import ast
from pathlib import Path


def module_files(root: Path, package: str = "cadenza") -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``package`` under ``root`` (``__init__`` named as
    its package)."""
    out = {}
    for f in sorted((root / package).rglob("*.py")):
        parts = f.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def imported_modules(path: Path, known: dict[str, Path], prefix: str = "cadenza") -> list[tuple[int, str]]:
    """(line, module) for every import of a ``prefix`` module in ``path``, at any depth (lazy imports in
    functions count: they close a circle as surely as a top-level one, only later). ``from a import b``
    names the module ``a.b`` when it is one, else ``a``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                for a in node.names
            ]
        else:
            continue
        for name in names:
            if name == prefix or name.startswith(prefix + "."):
                while name not in known and "." in name:
                    name = name.rsplit(".", 1)[0]
                out.append((node.lineno, name))
    return out


def import_graph(root: Path, package: str = "cadenza") -> dict[str, dict[str, int]]:
    """module -> {imported module: first line}, self-imports left out."""
    known = module_files(root, package)
    graph: dict[str, dict[str, int]] = {}
    for name, path in known.items():
        edges: dict[str, int] = {}
        for line, target in imported_modules(path, known, package):
            if target != name:
                edges.setdefault(target, line)
        graph[name] = edges
    return graph


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(graph[w])))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found
