"""The whole pipeline on a synthetic project in real venvs with real pytest: levels 1-3, gold patch, bad
input."""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from cadenza.errors import SourceError
from cadenza.tasks.builder.pipeline import BuildStats, SourceConfig, iter_task_drafts
from cadenza.tasks.deletion.baseline import run_baseline
from cadenza.tasks.deletion.statement import leaks
from cadenza.tasks.sources.fetch import fetch_source
from cadenza.tasks.sources.runner import pytest_args_for, run_pytest
from cadenza.tasks.sources.venv import ensure_base_env, make_task_env
from cadenza.tasks.validation.validate import recheck
from tests.support.tasks_helpers import make_repo, shared_env_cache

pytestmark = pytest.mark.network  # every base env installs its tooling with pip

HANG = """
import time

def test_hangs_forever():
    time.sleep(600)
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pipeline")
    # Build inside an enclosing git checkout, as `make demo` does (runs/ in the cadenza clone): git
    # commands on workspaces must never discover that outer repository.
    subprocess.run(["git", "init", "-q", str(tmp)], check=True)
    src = make_repo(tmp / "minilib")
    stats = BuildStats(source=str(src))
    cfg = SourceConfig(env_cache_dir=shared_env_cache(tmp_path_factory), per_test_timeout_s=10, probe=True)
    drafts = list(
        iter_task_drafts(
            str(src), tmp / "work", levels=(1, 2, 3), max_tasks=4, seed=1, config=cfg, stats=stats
        )
    )
    return src, drafts, stats, tmp


def test_drafts_cover_all_levels_and_are_valid(built) -> None:
    src, drafts, stats, _ = built
    levels = {d.task.level for d in drafts}
    assert levels == {1, 2, 3} and len(drafts) == 4, stats.to_dict()
    assert stats.validated == len(drafts) and stats.tried >= len(drafts) and stats.suite_size == 7
    # Budget: 2 baseline runs + about one full run per validated task (+ small partial runs).
    assert stats.counter.full_runs <= 2 + stats.tried
    assert len({d.task.id for d in drafts}) == len(drafts)
    for d in drafts:
        t = d.task
        assert t.fail_to_pass and t.pass_to_pass and not set(t.fail_to_pass) & set(t.pass_to_pass)
        assert set(t.fail_to_pass) | set(t.pass_to_pass) <= {
            f"tests/{n}"
            for n in (
                "test_core.py::test_add",
                "test_core.py::test_plus",
                "test_core.py::test_mul",
                "test_core.py::test_stack_push_pop",
                "test_core.py::test_stack_peek",
                "test_text.py::test_shout",
                "test_text.py::test_whisper",
            )
        }
        assert (
            "-p" not in t.pytest_args[t.pytest_args.index("-o") + 1]
        )  # the --cov/-p pytest_cov addopts are gone
        assert leaks(t.statement, d.deletion) == [] and t.feature.qualname in t.statement
        assert d.removed_snippets and not any(
            s in (d.workspace / t.feature.path).read_text()
            for s in d.removed_snippets
            if (d.workspace / t.feature.path).exists()
        )
        assert src.joinpath("minilib/core.py").read_text() != "" and not (src / ".pytest_cache").exists()


def test_draft_workspace_fails_and_gold_patch_fixes_it(built, tmp_path: Path) -> None:
    _, drafts, _, _ = built
    for i, d in enumerate(drafts[:4]):
        t = d.task
        env = make_task_env(d.base_env, d.workspace, tmp_path / f"env{i}")
        broken = run_pytest(
            env, d.workspace, t.fail_to_pass, timeout_s=120, per_test_timeout_s=5, extra_args=t.pytest_args
        )
        assert not broken.passing, t.id
        gold = tmp_path / f"gold{i}"
        shutil.copytree(d.workspace, gold)
        (tmp_path / "p.patch").write_text(d.gold_patch)
        subprocess.run(["git", "apply", str(tmp_path / "p.patch")], cwd=gold, check=True)
        env2 = make_task_env(d.base_env, gold, tmp_path / f"genv{i}")
        fixed = run_pytest(
            env2,
            gold,
            t.fail_to_pass + t.pass_to_pass,
            timeout_s=120,
            per_test_timeout_s=5,
            extra_args=t.pytest_args,
        )
        assert fixed.passing == set(t.fail_to_pass + t.pass_to_pass), t.id


def test_recheck_accepts_drafts_and_catches_a_wrong_gold_patch(built, tmp_path: Path) -> None:
    _, drafts, _, _ = built
    d = drafts[0]
    t = d.task
    kw = dict(
        workspace=d.workspace,
        fail_to_pass=t.fail_to_pass,
        pass_to_pass=t.pass_to_pass,
        make_python=lambda w, e: make_task_env(d.base_env, w, e),
        pytest_args=t.pytest_args,
        timeout_s=120,
        per_test_timeout_s=10,
    )
    assert recheck(gold_patch=d.gold_patch, scratch=tmp_path / "a", **kw).ok
    # A "fix" that leaves the feature broken: an empty patch cannot apply; a no-op patch leaves F2P failing.
    assert not recheck(gold_patch="", scratch=tmp_path / "b", **kw).ok
    noop = "diff --git a/NOTES b/NOTES\nnew file mode 100644\n--- /dev/null\n+++ b/NOTES\n@@ -0,0 +1 @@\n+x\n"
    res = recheck(gold_patch=noop, scratch=tmp_path / "c", **kw)
    assert not res.ok and "gold patch leaves" in res.reason
    assert not (d.workspace / "NOTES").exists()


def test_base_env_holds_no_copy_of_the_package(built) -> None:
    _, drafts, _, _ = built
    site = drafts[0].base_env.site_packages
    assert (site / "pytest").is_dir() and (site / "coverage").is_dir()
    assert not [p for p in site.iterdir() if p.name.lower().startswith("minilib")]


def test_hanging_test_is_cut_and_excluded_at_baseline(tmp_path_factory, tmp_path: Path) -> None:
    src = make_repo(tmp_path / "r", extra_tests={"test_hang.py": HANG})
    info = fetch_source(str(src), tmp_path / "copy")
    base = ensure_base_env(info, shared_env_cache(tmp_path_factory))
    py = make_task_env(base, info.root, tmp_path / "env")
    baseline, fmap = run_baseline(
        info, py, info.root, pytest_args=pytest_args_for(info.root), timeout_s=120, per_test_timeout_s=1.5
    )
    assert baseline.excluded == ["tests/test_hang.py::test_hangs_forever"]
    assert len(baseline.passing) == 7
    covering = {c.qualname: c.tests for c in fmap.candidates}
    assert covering["minilib.core.add"] == {
        "tests/test_core.py::test_add",
        "tests/test_core.py::test_plus",
        "tests/test_core.py::test_mul",
    }
    assert covering["minilib.textutil.shout"] == {"tests/test_text.py::test_shout"}
    assert covering["minilib.core.Stack"] == {
        "tests/test_core.py::test_stack_push_pop",
        "tests/test_core.py::test_stack_peek",
    }
    assert covering["minilib.textutil"] == {
        "tests/test_text.py::test_shout",
        "tests/test_text.py::test_whisper",
    }


def test_no_passing_tests_is_a_source_error(tmp_path_factory, tmp_path: Path) -> None:
    src = make_repo(tmp_path / "r")
    for f in (src / "tests").glob("test_*.py"):
        f.write_text("def test_fails():\n    assert False\n")
    cfg = SourceConfig(env_cache_dir=shared_env_cache(tmp_path_factory))
    with pytest.raises(SourceError, match="no test passes at baseline"):
        list(iter_task_drafts(str(src), tmp_path / "w", config=cfg))


def test_failing_install_is_a_source_error_naming_the_cause(tmp_path_factory, tmp_path: Path) -> None:
    src = make_repo(
        tmp_path / "r",
        pyproject=textwrap.dedent("""\
        [project]
        name = "minilib"
        version = "1"
        dependencies = ["cadenza-no-such-dependency-xyz==0.0.1"]
        """),
    )
    cfg = SourceConfig(env_cache_dir=shared_env_cache(tmp_path_factory))
    with pytest.raises(
        SourceError, match=r"cannot install the dependencies.*cadenza-no-such-dependency-xyz"
    ) as exc:
        list(iter_task_drafts(str(src), tmp_path / "w", config=cfg))
    assert "\n" not in str(exc.value)


def test_source_that_the_tooling_depends_on_is_refused(tmp_path_factory, tmp_path: Path) -> None:
    # pytest depends on `iniconfig`: a source of that name would find itself installed in its env.
    src = make_repo(
        tmp_path / "r", pyproject='[project]\nname = "iniconfig"\nversion = "9"\ndependencies = []\n'
    )
    (src / "minilib").rename(src / "iniconfig")
    for f in (src / "tests").glob("*.py"):
        f.write_text(f.read_text().replace("minilib", "iniconfig"))
    info = fetch_source(str(src), tmp_path / "copy")
    assert info.packages == ["iniconfig"]
    with pytest.raises(SourceError, match="installed copy of the package itself"):
        ensure_base_env(info, shared_env_cache(tmp_path_factory))


def test_package_that_does_not_import_from_source_is_named(tmp_path_factory, tmp_path: Path) -> None:
    src = make_repo(tmp_path / "r")
    core = src / "minilib" / "core.py"
    core.write_text(
        "from minilib._speedups import fast_add  # a C extension, never built\n" + core.read_text()
    )
    cfg = SourceConfig(env_cache_dir=shared_env_cache(tmp_path_factory))
    with pytest.raises(SourceError, match=r"does not import from its source tree \(ModuleNotFoundError"):
        list(iter_task_drafts(str(src), tmp_path / "w", config=cfg))
