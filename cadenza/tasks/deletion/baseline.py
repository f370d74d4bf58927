"""Baseline: which tests pass reliably before anything is deleted.

The suite runs twice, both times inside bubblewrap as validation and grading run it (no network,
only the workspace writable): once plain, and once under coverage with per-test contexts (the run
that feeds feature discovery), so the coverage run doubles as the second baseline run. A test must pass in
both to count; tests that fail, error or flip between the runs (e.g. one that needs the network)
are excluded from every task and reported. A source with no passing test is unusable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cadenza.errors import SourceError
from cadenza.sandbox import SandboxConfig
from cadenza.tasks.deletion.features import FeatureMap, map_features
from cadenza.tasks.sources.runner import RunCounter, TestReport, run_pytest, run_python
from cadenza.tasks.sources.source import SourceInfo


@dataclass(kw_only=True)
class Baseline:
    """``passing``: passed in both runs; ``excluded``: failed/errored in a run or flipped; ``skipped``:
    never ran."""

    passing: list[str]
    excluded: list[str]
    skipped: list[str]
    reports: list[TestReport] = field(default_factory=list)

    @property
    def suite_size(self) -> int:
        return len(self.passing) + len(self.excluded) + len(self.skipped)


def combine_runs(first: TestReport, second: TestReport) -> Baseline:
    """Merge two full runs: pass-in-both passes; any failure or flip is excluded; skips are set aside."""
    ids = sorted(set(first.outcomes) | set(second.outcomes))
    passing, excluded, skipped = [], [], []
    for nid in ids:
        a, b = first.outcome(nid), second.outcome(nid)
        if a == b == "passed":
            passing.append(nid)
        elif a in ("skipped", "xfailed") and b in ("skipped", "xfailed"):
            skipped.append(nid)
        else:
            excluded.append(nid)
    return Baseline(passing=passing, excluded=excluded, skipped=skipped, reports=[first, second])


def _raise_if_unimportable(source: SourceInfo, python: Path, workspace: Path) -> None:
    proc = run_python(python, "".join(f"import {p}\n" for p in source.packages), cwd=workspace)
    if proc.returncode != 0:
        err = (proc.stderr.strip().splitlines() or ["?"])[-1][:160]
        raise SourceError(
            f"{source.spec}: no test can pass because the package does not import from its source tree "
            f"({err}); "
            "sources needing a build step (C extensions, generated files) are not supported"
        )


def run_baseline(
    source: SourceInfo,
    python: Path,
    workspace: Path,
    *,
    pytest_args: list[str],
    timeout_s: float,
    per_test_timeout_s: float | None,
    counter: RunCounter | None = None,
    sandbox: SandboxConfig | None = SandboxConfig(),  # never mutated
) -> tuple[Baseline, FeatureMap]:
    """Two full runs in ``sandbox`` (plain, then under coverage); returns the baseline and the feature map."""
    limits = dict(
        timeout_s=timeout_s, per_test_timeout_s=per_test_timeout_s, counter=counter, sandbox=sandbox
    )
    plain = run_pytest(python, workspace, None, extra_args=pytest_args, **limits)
    if plain.timed_out:
        raise SourceError(
            f"{source.spec}: the test suite did not finish within {timeout_s:g}s; raise the suite "
            "timeout or pick a faster suite"
        )
    if not plain.outcomes:
        _raise_if_unimportable(source, python, workspace)
        tail = " ".join(plain.output_tail.strip().splitlines()[-2:])[:200]
        raise SourceError(
            f"{source.spec}: pytest collected no tests ({tail or 'no output'}); check the test layout"
        )
    fmap = map_features(source, python, workspace, passing=set(), pytest_args=pytest_args, **limits)
    baseline = combine_runs(plain, fmap.report)
    if not baseline.passing:
        _raise_if_unimportable(source, python, workspace)
        raise SourceError(
            f"{source.spec}: no test passes at baseline ({len(baseline.excluded)} failing or flaky); "
            "the environment is probably missing a test dependency"
        )
    passing = set(baseline.passing)
    for cand in fmap.candidates:
        cand.tests &= passing
    return baseline, fmap
