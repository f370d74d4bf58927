"""Feature discovery: which tests execute which functions, methods, classes and modules.

One pytest run under ``coverage run`` with a coverage context per test node ID (the runner's
plugin calls ``Coverage.switch_context(nodeid)`` around each test). Definitions are located with
``ast``; a definition is covered by a test when that test executed a line of its *body* (def lines
and class bodies run at import time, in no test's context, so they do not count).
"""

from __future__ import annotations

import ast
import tempfile
from dataclasses import dataclass, field, fields
from pathlib import Path

from cadenza.sandbox import SandboxConfig
from cadenza.tasks.records.task import Feature, FeatureKind
from cadenza.tasks.sources.runner import RunCounter, TestReport, run_pytest
from cadenza.tasks.sources.source import SourceInfo, is_test_path


@dataclass(kw_only=True)
class Candidate:
    """A deletable definition. ``local`` is the dotted name inside its module (``Class.method``)."""

    qualname: str
    module: str
    local: str
    path: str
    kind: FeatureKind
    lineno: int
    end_lineno: int
    body_lines: int
    tests: set[str] = field(default_factory=set)

    def feature(self) -> Feature:
        """What a task built from this definition records as deleted (every field of a
        :class:`~cadenza.tasks.records.task.Feature` is one of a candidate's)."""
        return Feature(**{f.name: getattr(self, f.name) for f in fields(Feature)})


@dataclass(kw_only=True)
class FeatureMap:
    """All definitions of the project and the tests covering each (``tests`` only baseline-passing)."""

    candidates: list[Candidate]
    report: TestReport

    def by_qualname(self) -> dict[str, Candidate]:
        return {c.qualname: c for c in self.candidates}


def module_files(source: SourceInfo) -> dict[str, str]:
    """Root-relative path -> dotted module name for every non-test module of the project."""
    out: dict[str, str] = {}
    root = source.root
    base = root / source.import_root if source.import_root != "." else root
    for name, rel in source.package_dirs.items():
        path = root / rel
        files = [path] if path.is_file() else sorted(path.rglob("*.py"))
        for f in files:
            rel_root = f.relative_to(root).as_posix()
            rel_base = f.relative_to(base)
            if is_test_path(rel_base) or "__pycache__" in rel_base.parts:
                continue
            parts = list(rel_base.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if not all(p.isidentifier() for p in parts):
                continue
            out[rel_root] = ".".join(parts) if parts else name
    return out


def _is_docstring(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


def definitions(tree: ast.Module, module: str, path: str) -> list[Candidate]:
    """Functions, methods and classes at module or class level (not nested in functions)."""
    out: list[Candidate] = []

    def visit(body: list[ast.stmt], prefix: str, in_class: bool) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                local = f"{prefix}{node.name}"
                start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                stmts = [s for i, s in enumerate(node.body) if not (i == 0 and _is_docstring(s))]
                body_lines = sum((s.end_lineno or s.lineno) - s.lineno + 1 for s in stmts)
                if isinstance(node, ast.ClassDef):
                    kind: FeatureKind = "class"
                else:
                    kind = "method" if in_class else "function"
                out.append(
                    Candidate(
                        qualname=f"{module}.{local}",
                        module=module,
                        local=local,
                        path=path,
                        kind=kind,
                        lineno=start,
                        end_lineno=node.end_lineno or node.lineno,
                        body_lines=body_lines,
                    )
                )
                if isinstance(node, ast.ClassDef):
                    visit(node.body, f"{local}.", True)

    visit(tree.body, "", False)
    return out


def body_line_set(node_body: list[ast.stmt]) -> set[int]:
    lines: set[int] = set()
    for i, s in enumerate(node_body):
        if i == 0 and _is_docstring(s):
            continue
        lines.update(range(s.lineno, (s.end_lineno or s.lineno) + 1))
    return lines


def _def_nodes(tree: ast.Module) -> dict[str, ast.AST]:
    out: dict[str, ast.AST] = {}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out[f"{prefix}{node.name}"] = node
                if isinstance(node, ast.ClassDef):
                    visit(node.body, f"{prefix}{node.name}.")

    visit(tree.body, "")
    return out


def coverage_rc(source: SourceInfo, workspace: Path, data_file: Path, rc_path: Path) -> Path:
    include = []
    for rel in source.package_dirs.values():
        p = (workspace / rel).resolve()
        include.append(str(p) if p.suffix == ".py" else f"{p}/*")
    rc_path.write_text(
        f"[run]\ndata_file = {data_file}\ninclude =\n" + "".join(f"    {i}\n" for i in include)
    )
    return rc_path


def map_features(
    source: SourceInfo,
    python: Path,
    workspace: Path,
    *,
    passing: set[str],
    pytest_args: list[str],
    timeout_s: float,
    per_test_timeout_s: float | None,
    counter: RunCounter | None = None,
    sandbox: SandboxConfig | None = SandboxConfig(),  # never mutated
) -> FeatureMap:
    """Run the suite once under coverage in ``workspace`` and map definitions to covering tests.

    ``passing`` restricts covering tests to those passing at baseline (pass an empty set to keep
    every test). The run's own :class:`TestReport` is returned too, so a caller can use it as one
    of the baseline runs. The run executes the project's tests: inside ``sandbox`` (bubblewrap, no
    network), with the coverage data directory as its only writable path besides the workspace.
    """
    from coverage import CoverageData

    workspace = Path(workspace)
    with tempfile.TemporaryDirectory(prefix="cadenza-cov-") as tmp:
        data_file = Path(tmp) / "coverage.db"
        rc = coverage_rc(source, workspace, data_file, Path(tmp) / "coveragerc")
        report = run_pytest(
            python,
            workspace,
            None,
            timeout_s=timeout_s,
            per_test_timeout_s=per_test_timeout_s,
            extra_args=pytest_args,
            coverage_rc=rc,
            counter=counter,
            sandbox=sandbox,
            writable=[Path(tmp)],
        )
        contexts: dict[str, dict[int, list[str]]] = {}
        if data_file.exists():
            data = CoverageData(basename=str(data_file))
            data.read()
            ws = workspace.resolve()
            for f in data.measured_files():
                try:
                    rel = Path(f).resolve().relative_to(ws).as_posix()
                except ValueError:
                    continue
                contexts[rel] = {
                    ln: [c for c in ctxs if c] for ln, ctxs in data.contexts_by_lineno(f).items()
                }
    candidates: list[Candidate] = []
    for rel, module in module_files(source).items():
        try:
            tree = ast.parse((workspace / rel).read_text())
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        file_ctx = contexts.get(rel, {})
        nodes = _def_nodes(tree)
        defs = definitions(tree, module, rel)
        module_tests: set[str] = set()
        for cand in defs:
            node = nodes[cand.local]
            lines = body_line_set(node.body)  # type: ignore[attr-defined]
            tests: set[str] = set()
            for ln in lines:
                tests.update(file_ctx.get(ln, ()))
            if passing:
                tests &= passing
            cand.tests = tests
            module_tests |= tests
        for cand in defs:
            if cand.kind == "class":
                # A class counts as covered by whatever covers its methods.
                for other in defs:
                    if other.local.startswith(cand.local + "."):
                        cand.tests |= other.tests
        candidates += defs
        n_lines = len((workspace / rel).read_text().splitlines())
        candidates.append(
            Candidate(
                qualname=module,
                module=module,
                local="",
                path=rel,
                kind="module",
                lineno=1,
                end_lineno=n_lines,
                body_lines=n_lines,
                tests=module_tests,
            )
        )
    return FeatureMap(candidates=candidates, report=report)
