"""Candidate pruning and ordering (pure: no environments)."""

from __future__ import annotations

from cadenza.tasks.builder.ordering import order_candidates, task_id
from cadenza.tasks.deletion.baseline import Baseline
from cadenza.tasks.deletion.features import Candidate, FeatureMap
from cadenza.tasks.sources.runner import TestReport
from cadenza.tasks.sources.source import SourceInfo

PASSING = [f"t.py::test_{i}" for i in range(4)]


def _c(qualname: str, kind: str, tests: set[str], path: str = "pkg/m.py") -> Candidate:
    module = qualname if kind == "module" else "pkg.m"
    local = "" if kind == "module" else qualname[len("pkg.m.") :]
    return Candidate(
        qualname=qualname,
        module=module,
        local=local,
        path=path,
        kind=kind,
        lineno=1,
        end_lineno=2,
        body_lines=1,
        tests=tests,
    )


def test_pruning_and_interleaving_are_deterministic() -> None:
    t = set(PASSING[:2])
    cands = [
        _c("pkg.m.f", "function", t),
        _c("pkg.m.g", "function", t),
        _c("pkg.m.C.meth", "method", t),
        _c("pkg.m.C", "class", t),
        _c("pkg.m", "module", t),
        _c("pkg.m.uncovered", "function", set()),
        _c("pkg.m.everything", "function", set(PASSING)),
        _c("pkg.m.dup", "function", t),
        _c("pkg.m.dup", "function", t),
        _c("pkg", "module", t, "pkg/__init__.py"),
        _c("single", "module", t, "single.py"),
    ]
    fmap = FeatureMap(
        candidates=cands,
        report=TestReport(outcomes={}, requested=None, exit_code=0, timed_out=False, duration_s=0),
    )
    base = Baseline(passing=PASSING, excluded=[], skipped=[])
    order = order_candidates(fmap, base, (1, 2, 3), seed=7, top_level=frozenset({"single"}))
    names = {(lv, c.qualname) for lv, c in order}
    assert names == {(lv, q) for lv in (1, 2) for q in ("pkg.m.f", "pkg.m.g", "pkg.m.C.meth")} | {
        (3, "pkg.m.C"),
        (3, "pkg.m"),
    }
    assert [lv for lv, _ in order[:3]] == [1, 2, 3]  # levels interleave
    assert order == order_candidates(fmap, base, (1, 2, 3), seed=7, top_level=frozenset({"single"}))
    other = [c.qualname for lv, c in order_candidates(fmap, base, (1,), seed=8) if lv == 1]
    assert sorted(other) == sorted(q for lv, q in names if lv == 1)


def test_task_ids_are_deterministic_and_distinct(tmp_path) -> None:
    src = SourceInfo(
        spec="pypi:x",
        root=tmp_path,
        name="x",
        packages=["x"],
        package_dirs={"x": "x"},
        import_root=".",
        layout="flat",
        version="1.0",
        content_hash="abc",
    )
    a = task_id(src, "x.mod.f", 1)
    assert a == task_id(src, "x.mod.f", 1) and a.startswith("x-1.0__x.mod.f__L1-")
    assert len({a, task_id(src, "x.mod.f", 2), task_id(src, "x.mod.g", 1)}) == 3
