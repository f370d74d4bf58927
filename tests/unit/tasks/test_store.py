"""Task store: atomic publish, crash repair, schema versioning, and the read-side CLI commands."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from cadenza.errors import CadenzaError
from cadenza.tasks.records.store import INDEX, MIGRATIONS, STAGING, SourceReport, TaskStore
from cadenza.tasks.records.task import load_task, save_task
from tests.support.taskfixture import make_task, mini_base
from tests.support.torchless import cadenza_torchless


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``cadenza tasks ...`` in a subprocess with torch and the other ``train`` packages blocked: the task
    CLI works after a plain ``pip install cadenza``."""
    return cadenza_torchless("tasks", *args)


@pytest.fixture(scope="module")
def base_site(tmp_path_factory) -> Path:
    return mini_base(tmp_path_factory.mktemp("base") / "site-packages")


@pytest.fixture(scope="module")
def template(tmp_path_factory, base_site) -> Path:
    return make_task(tmp_path_factory.mktemp("tpl"), base_site=base_site)


def stage_copy(store: TaskStore, template: Path, task_id: str | None = None):
    """Assemble a copy of the template task in the store's staging dir; returns (staging dir, task)."""
    task = load_task(template)
    if task_id:
        task.id = task_id
        task.feature.qualname += f"_{task_id}"
    ctx = store.staging(task.id)
    tmp = ctx.__enter__()
    shutil.rmtree(tmp)
    shutil.copytree(template, tmp, symlinks=True)
    save_task(tmp, task)
    return ctx, tmp, task


def test_publish_limit_and_keys(tmp_path, template):
    store = TaskStore(tmp_path / "set", create=True)
    spec = str(load_task(template).meta.get("spec", load_task(template).source))
    published = []
    for tid in ("a-1", "a-2", "a-3"):
        ctx, tmp, task = stage_copy(store, template, tid)
        published.append(store.publish(tmp, task, limit=2))
        ctx.__exit__(None, None, None)
    assert published == [True, True, False] and store.count(spec) == 2  # never past --max-tasks
    assert (
        store.keys(spec) == {(r["qualname"], r["level"]) for r in store.rows()} and len(store.keys(spec)) == 2
    )
    assert store.keys("pypi:something-else") == set()


def test_publish_is_atomic_and_unique(tmp_path, template):
    store = TaskStore(tmp_path / "set", create=True)
    ctx, tmp, task = stage_copy(store, template)
    assert store.publish(tmp, task)
    ctx.__exit__(None, None, None)
    assert (tmp_path / "set" / task.id / "task.json").is_file() and not tmp.exists()
    assert store.has(task) and store.count() == 1
    ctx, tmp2, _ = stage_copy(store, template)
    assert not store.publish(tmp2, task)  # same id / same (source, qualname, level)
    ctx.__exit__(None, None, None)
    assert not tmp2.exists() and store.count() == 1
    assert not any((tmp_path / "set" / STAGING).iterdir())


def test_recover_after_crash(tmp_path, template):
    root = tmp_path / "set"
    TaskStore(root, create=True)
    # a crash mid-assembly: staging dir of a dead process
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    half = root / STAGING / f"x.{dead}.deadbeef"
    (half / "workspace").mkdir(parents=True)
    # a crash between rename and index insert: a complete dir the index does not know
    shutil.copytree(template, root / "orphan", symlinks=True)
    t = load_task(root / "orphan")
    t.id = "orphan"
    save_task(root / "orphan", t)
    # a row whose dir was removed by hand
    with sqlite3.connect(root / INDEX) as con:
        con.execute(
            "INSERT INTO tasks (id, spec, source, level, qualname, kind, path, f2p, p2p, created)"
            " VALUES ('ghost', 's', 's', 1, 'q', 'function', 'p', 1, 1, 'now')"
        )
    TaskStore(root)
    assert not half.exists()
    ids = [r["id"] for r in TaskStore(root).rows()]
    assert ids == ["orphan"]


def test_a_source_report_reads_back_as_it_was_recorded(tmp_path):
    store = TaskStore(tmp_path / "set", create=True)
    build = store.start_build({"sources": ["pypi:x"]})
    rep = SourceReport(source="pypi:x", status="done", candidates=7, validated=3, emitted=2, rejected=1,
                       skipped=4, suite_runs=5.5, seconds=61.25, prepare_seconds=12.5)  # fmt: skip
    store.record_source(build, "key", rep)
    assert store.source_reports(build) == [rep]


def test_schema_version_and_bad_index(tmp_path):
    store = TaskStore(tmp_path / "set", create=True)
    assert store.schema_version == len(MIGRATIONS)
    with sqlite3.connect(tmp_path / "set" / INDEX) as con:
        con.execute("INSERT INTO schema_version (version) VALUES (?)", (len(MIGRATIONS) + 5,))
    with pytest.raises(CadenzaError, match="newer than this cadenza"):
        TaskStore(tmp_path / "set")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / INDEX).write_bytes(b"not a database" * 100)
    with pytest.raises(CadenzaError, match="not a readable task index"):
        TaskStore(tmp_path / "junk")
    with pytest.raises(CadenzaError, match="does not exist"):
        TaskStore(tmp_path / "missing")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(CadenzaError, match="not empty and not a task set"):
        TaskStore(tmp_path / "busy", create=True)
    with pytest.raises(CadenzaError, match="invalid task id"):
        store.task_dir("../etc")


@pytest.fixture(scope="module")
def task_set(tmp_path_factory, template) -> Path:
    root = tmp_path_factory.mktemp("cli") / "set"
    store = TaskStore(root, create=True)
    for tid in ("minipkg-a", "minipkg-b"):
        ctx, tmp, task = stage_copy(store, template, tid)
        store.publish(tmp, task)
        ctx.__exit__(None, None, None)
    return root


def test_list_show_env_export(task_set):
    rows = json.loads(cli("list", str(task_set), "--json").stdout)
    assert (
        [r["id"] for r in rows] == ["minipkg-a", "minipkg-b"]
        and rows[0]["f2p"] == 1
        and rows[0]["level"] == 2
    )
    assert "minipkg-a" in cli("list", str(task_set)).stdout
    shown = cli("show", str(task_set), "minipkg-b")
    assert shown.returncode == 0 and "merge_counts" in shown.stdout and "test_merge_counts" in shown.stdout
    py = cli("env", str(task_set / "minipkg-a")).stdout.strip()
    assert os.access(py, os.X_OK)
    out = subprocess.run(
        [py, "-c", "import minipkg, pytest; print(minipkg.__file__)"], capture_output=True, text=True
    )
    assert out.stdout.strip().startswith(str(task_set / "minipkg-a" / "workspace")), out.stderr
    lines = cli("export", str(task_set), "--format", "swebench").stdout.splitlines()
    recs = [json.loads(x) for x in lines]
    assert [r["instance_id"] for r in recs] == ["minipkg-a", "minipkg-b"]
    rec = recs[0]
    assert json.loads(rec["FAIL_TO_PASS"]) == ["tests/test_core.py::test_merge_counts"]
    assert rec["PASS_TO_PASS"]
    assert "+def merge_counts" in rec["patch"] and len(rec["base_commit"]) == 40 and rec["problem_statement"]
    assert cli("export", str(task_set), "--format", "csv").returncode == 2


@pytest.mark.slow  # over 10 s on 2 cores: in make test, not make test-fast
def test_verify_passes_and_catches_broken_tasks(task_set, tmp_path):
    ok = cli("verify", str(task_set), "--task", "minipkg-a")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert not list((task_set / "minipkg-a" / "workspace").rglob("__pycache__"))  # ran in a copy
    broken = tmp_path / "set"
    shutil.copytree(task_set, broken, symlinks=True)
    (broken / "minipkg-a" / "gold.patch").write_text(
        (broken / "minipkg-a" / "gold.patch").read_text().replace("> floor", "< floor")
    )
    t = load_task(broken / "minipkg-b")
    t.pass_to_pass.append("tests/test_core.py::test_does_not_exist")
    save_task(broken / "minipkg-b", t)
    res = cli("verify", str(broken))
    assert res.returncode == 1
    assert "FAIL minipkg-a: gold patch leaves" in res.stdout and "FAIL minipkg-b:" in res.stdout
    assert "test_does_not_exist" in res.stdout and "0 of 2 task(s) verified" in res.stdout


@pytest.mark.parametrize(
    "args", [("list", "{missing}"), ("show", "{set}", "nope"), ("env", "{missing}"), ("verify", "{missing}")]
)
def test_bad_input_is_one_line(task_set, tmp_path, args):
    argv = [a.format(missing=tmp_path / "missing", set=task_set) for a in args]
    res = cli(*argv)
    assert (
        res.returncode == 2 and res.stderr.startswith("error:") and len(res.stderr.strip().splitlines()) == 1
    ), res.stderr


def _publish_copy(args: tuple[str, str]) -> bool:
    root, template = args
    store = TaskStore(root)
    task = load_task(template)
    with store.staging(task.id) as tmp:
        shutil.rmtree(tmp)
        shutil.copytree(template, tmp, symlinks=True)
        return store.publish(tmp, task)


def test_concurrent_publishers_add_exactly_once(tmp_path, template):
    import multiprocessing as mp

    root = tmp_path / "set"
    TaskStore(root, create=True)
    with mp.get_context("spawn").Pool(4) as pool:
        results = pool.map(_publish_copy, [(str(root), str(template))] * 4)
    assert sorted(results) == [False, False, False, True]
    assert TaskStore(root).count() == 1 and not any((root / STAGING).iterdir())
