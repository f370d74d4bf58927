"""The capability check of grading: what the agent's change may use, decided against the pristine code.

Runs in the trusted parent before any of the change executes (:mod:`cadenza.testrun.capabilities`
finds the uses). A kept Python file may use a process-level capability only if its pristine version
or the pristine package (its non-test Python files) already does; native extension modules and
bytecode the agent adds or changes are never allowed. Findings fail the grade and are flagged
(``capability``).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path, PurePosixPath

from cadenza.agent.grading.policy import GradePolicy
from cadenza.testrun.capabilities import GUARD_KINDS, Finding, kinds, new_capabilities

PY_SUFFIXES = (".py", ".pyw")
NATIVE_SUFFIXES = (".so", ".pyd", ".dylib", ".dll")
BYTECODE_SUFFIXES = (".pyc", ".pyo")


def capability_findings(pristine: Path, work: Path, applied: list[str], policy: GradePolicy) -> list[Finding]:
    """Findings for the applied (kept) changes, read from the graded copy ``work``."""
    changed: dict[str, bytes] = {}
    found: list[Finding] = []
    for rel in applied:
        path = work / rel
        if not path.is_file() or policy.is_test(rel):
            continue
        if rel.endswith(NATIVE_SUFFIXES) or ".so." in PurePosixPath(rel).name:
            found.append(Finding(rel, 0, "ctypes", "a native extension module"))
        elif rel.endswith(BYTECODE_SUFFIXES):
            found.append(Finding(rel, 0, "unreadable", "compiled bytecode, whose source is not what runs"))
        elif rel.endswith(PY_SUFFIXES):
            changed[rel] = path.read_bytes()
    if not changed:
        return found
    before = {rel: (pristine / rel).read_bytes() for rel in changed if (pristine / rel).is_file()}
    return found + new_capabilities(changed, before, package_kinds(pristine, policy))


def package_kinds(pristine: Path, policy: GradePolicy) -> frozenset[str]:
    """The capability kinds the pristine package's non-test Python files use."""
    files = tuple(
        sorted(rel for rel in policy.pristine_files if rel.endswith(PY_SUFFIXES) and not policy.is_test(rel))
    )
    return _package_kinds(str(pristine), files)


@lru_cache(maxsize=256)
def _package_kinds(root: str, files: tuple[str, ...]) -> frozenset[str]:
    out: set[str] = set()
    for rel in files:
        try:
            out |= kinds((Path(root) / rel).read_bytes())
        except OSError:
            continue
    return frozenset(out - {"unreadable", "encoding"})


def guard_allowances(pristine: Path, work: Path, policy: GradePolicy) -> dict[str, list[str]]:
    """What the guard lets each Python file of the graded copy do: the capabilities the capability check
    allows it (its pristine version's and the pristine package's), never the ones the change added."""
    package = package_kinds(pristine, policy)
    out: dict[str, list[str]] = {}
    for path in work.rglob("*.py"):
        rel = str(path.relative_to(work))
        if policy.is_test(rel):
            continue
        own = kinds((pristine / rel).read_bytes()) if (pristine / rel).is_file() else frozenset()
        allowed = sorted({GUARD_KINDS[k] for k in own | package if k in GUARD_KINDS})
        if allowed:
            out[rel] = allowed
    return out
