"""publish_draft: a validated draft becomes a scrubbed, scanned, atomically published task, or nothing."""

from __future__ import annotations

import py_compile
import shutil
import subprocess
from types import SimpleNamespace

import pytest

from cadenza.tasks.builder.factory import publish_draft
from cadenza.tasks.leaks.scan import scan_tasks
from cadenza.tasks.records.store import STAGING, TaskStore
from cadenza.tasks.records.task import load_task
from cadenza.tasks.sources.venv import BaseEnv
from tests.support.taskfixture import CORE_ORIGINAL, make_task, mini_base, original_tree


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> BaseEnv:
    root = tmp_path_factory.mktemp("base")
    site = mini_base(root / "site-packages")
    return BaseEnv(
        root=root,
        site_packages=site,
        dist_name="minipkg",
        version="1.0",
        import_root=".",
        packages=["minipkg"],
    )


@pytest.fixture
def draft(tmp_path, base):
    """What the pipeline yields: a post-deletion workspace (dirty, as a real checkout may be) + gold patch."""
    task_dir = make_task(tmp_path / "drafts", with_env=False)
    ws = task_dir / "workspace"
    original = original_tree(tmp_path / "orig")
    # the leftovers a real source tree carries: a .pyc of the original, a build/ copy, egg-info, history
    (ws / "minipkg" / "__pycache__").mkdir()
    py_compile.compile(
        str(original / "minipkg" / "core.py"),
        cfile=str(ws / "minipkg" / "__pycache__" / "core.cpython-311.pyc"),
    )
    shutil.copytree(original / "minipkg", ws / "build" / "lib" / "minipkg")
    (ws / "minipkg.egg-info").mkdir()
    (ws / "minipkg.egg-info" / "SOURCES.txt").write_text("minipkg/core.py\n")
    task = load_task(task_dir)
    return SimpleNamespace(
        task=task,
        workspace=ws,
        gold_patch=(task_dir / "gold.patch").read_text(),
        base_env=base,
        removed_snippets=[CORE_ORIGINAL],
    )


def test_dirty_draft_is_scrubbed_and_published(tmp_path, draft):
    store = TaskStore(tmp_path / "set", create=True)
    res = publish_draft(store, draft, "spec-a")
    assert res.status == "added", res
    task_dir = tmp_path / "set" / draft.task.id
    assert scan_tasks([task_dir]) == []
    assert (
        not (task_dir / "workspace" / "build").exists()
        and not (task_dir / "workspace" / "minipkg.egg-info").exists()
    )
    assert [r["id"] for r in store.rows()] == [draft.task.id] and store.rows()[0]["spec"] == "spec-a"
    py = task_dir / "env" / "bin" / "python"
    out = subprocess.run(
        [str(py), "-c", "import minipkg; print(minipkg.__file__)"], capture_output=True, text=True, cwd="/"
    )
    assert out.stdout.strip() == str(task_dir / "workspace" / "minipkg" / "__init__.py"), out.stderr
    assert publish_draft(store, draft, "spec-a").status == "exists"
    assert not any((tmp_path / "set" / STAGING).iterdir())


def test_unfixable_leak_is_never_published(tmp_path, draft):
    # a second copy of the deleted function inside the package itself: the scrub cannot own it
    (draft.workspace / "minipkg" / "_compat.py").write_text(CORE_ORIGINAL)
    store = TaskStore(tmp_path / "set", create=True)
    res = publish_draft(store, draft, "spec-a")
    assert res.status == "leak" and any("_compat.py" in f.path for f in res.findings)
    assert store.rows() == [] and not (tmp_path / "set" / draft.task.id).exists()
    assert not any((tmp_path / "set" / STAGING).iterdir())
