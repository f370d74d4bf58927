"""A real PyPI sdist through the draft pipeline in-process (network: PyPI via pip): layout, gold patch,
deps-only base env, cost per source. A fourth package beside test_build.py's three."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from cadenza.tasks.builder.pipeline import BuildStats, SourceConfig, iter_task_drafts
from cadenza.tasks.deletion.statement import leaks
from tests.support.tasks_helpers import shared_env_cache

pytestmark = [pytest.mark.slow, pytest.mark.network]

CASES = [
    # spec, levels, expected layout, a test dependency the env must provide (None: none needed). The
    # other two layouts (cachetools: src, tinydb: flat, with yaml) are built end to end by test_build.py,
    # whose tasks are also verified, scanned and checked for their test dependency.
    ("pypi:voluptuous==0.16.0", (2, 3), "tests-inside-package", None),
]


@pytest.mark.parametrize(("spec", "levels", "layout", "test_dep"), CASES, ids=[c[0] for c in CASES])
def test_real_package_yields_validated_drafts(
    spec, levels, layout, test_dep, tmp_path_factory, tmp_path: Path
) -> None:
    stats = BuildStats(source=spec)
    cfg = SourceConfig(
        env_cache_dir=shared_env_cache(tmp_path_factory), per_test_timeout_s=30, max_candidates=12
    )
    drafts = list(
        iter_task_drafts(spec, tmp_path / "work", levels=levels, max_tasks=1, seed=3, config=cfg, stats=stats)
    )
    assert len(drafts) == 1, stats.to_dict()
    d = drafts[0]
    t = d.task
    assert d.source.layout == layout and t.level in levels
    assert t.fail_to_pass and t.pass_to_pass and len(t.fail_to_pass) + len(t.pass_to_pass) <= stats.suite_size
    assert any(f.endswith(".py") and "test" in f for f in t.test_files)
    assert leaks(t.statement, d.deletion) == [] and t.feature.qualname in t.statement
    assert d.removed_snippets
    # The gold patch restores the original files byte for byte with real `git apply`.
    gold = tmp_path / "gold"
    shutil.copytree(d.workspace, gold)
    (tmp_path / "gold.patch").write_text(d.gold_patch)
    subprocess.run(["git", "apply", str(tmp_path / "gold.patch")], cwd=gold, check=True)
    for rel, text in d.deletion.original.items():
        assert (gold / rel).read_text() == text == (d.source.root / rel).read_text()
    # Deps-only base env: test deps present, no copy of the package itself.
    site = d.base_env.site_packages
    assert not [p for p in site.iterdir() if p.name.split("-")[0].split(".")[0] in d.source.packages]
    if test_dep:
        assert (site / test_dep).is_dir()
    # Cost per source: 2 baseline runs, then about one full run per attempt.
    assert stats.counter.full_runs <= 2 + stats.tried
