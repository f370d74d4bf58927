"""A small hand-made task (level 2: ``minipkg.core.merge_counts`` removed) for store/scan/scrub tests.

Built the way the pipeline builds one: an original tree, a post-deletion workspace, the gold patch
from ``git diff`` (restoring the function), a light venv whose .pth finds the workspace.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

from cadenza.tasks.records.task import Feature, Task, save_task

CORE_ORIGINAL = '''"""Counting helpers."""

from collections import Counter


def merge_counts(first, second, *, floor=0):
    """Merge two count mappings, dropping totals at or below the floor."""
    combined = Counter(first)
    for token, amount in second.items():
        combined[token] = combined.get(token, 0) + amount
    survivors = {tok: n for tok, n in combined.items() if n > floor}
    return dict(sorted(survivors.items(), key=lambda kv: (-kv[1], kv[0])))


def top_token(counts):
    """The most frequent token (ties broken alphabetically)."""
    return min(counts, key=lambda tok: (-counts[tok], tok))
'''

INIT_ORIGINAL = """from minipkg.core import merge_counts, top_token

__all__ = ["merge_counts", "top_token"]
"""

TESTS = """from minipkg import core


def test_top_token():
    assert core.top_token({"a": 1, "b": 3}) == "b"


def test_merge_counts():
    assert core.merge_counts({"a": 2}, {"a": 1, "b": 1}, floor=1) == {"a": 3}
"""

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@t",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@t",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "init.defaultBranch=main", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, **GIT_ENV},
    ).stdout


def post_deletion(text: str) -> str:
    start = text.index("def merge_counts")
    end = text.index("def top_token")
    return text[:start] + text[end:]


def write_tree(root: Path, core: str, init: str) -> None:
    (root / "minipkg").mkdir(parents=True, exist_ok=True)
    (root / "tests").mkdir(exist_ok=True)
    (root / "minipkg" / "core.py").write_text(core)
    (root / "minipkg" / "__init__.py").write_text(init)
    (root / "tests" / "test_core.py").write_text(TESTS)
    (root / "README.md").write_text("# minipkg\n\nCount things: `top_token`.\n")


def gold_patch(tmp: Path) -> str:
    """``git diff`` from the post-deletion tree back to the original."""
    repo = tmp / "patchrepo"
    write_tree(
        repo, post_deletion(CORE_ORIGINAL), 'from minipkg.core import top_token\n\n__all__ = ["top_token"]\n'
    )
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "post")
    write_tree(repo, CORE_ORIGINAL, INIT_ORIGINAL)
    patch = git(repo, "diff")
    shutil.rmtree(repo)
    return patch


def mini_base(dest: Path) -> Path:
    """A small shared 'base env' site dir: pytest and its plugins linked from this interpreter."""
    import pytest

    site = Path(pytest.__file__).resolve().parent.parent
    dest.mkdir(parents=True, exist_ok=True)
    for entry in site.iterdir():
        name = entry.name.lower()
        if name.split("-")[0].split(".")[0] in (
            "pytest",
            "_pytest",
            "pluggy",
            "iniconfig",
            "packaging",
            "pytest_timeout",
            "py",
            "pygments",
        ):
            (dest / entry.name).symlink_to(entry)
    return dest


def make_light_env(env_dir: Path, workspace: Path, base_site: Path | None = None) -> None:
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env_dir)
    site = next(env_dir.glob("lib/python*/site-packages"))
    base = f"import site; site.addsitedir({str(base_site)!r})\n" if base_site else ""
    (site / "task.pth").write_text(os.path.relpath(workspace, site) + "\n" + base)


def make_task(
    tmp: Path, task_id: str = "minipkg-merge", with_env: bool = True, base_site: Path | None = None
) -> Path:
    """A complete task dir (task.json, workspace/, gold.patch, env/) under ``tmp/task_id``."""
    task_dir = tmp / task_id
    ws = task_dir / "workspace"
    patch = gold_patch(tmp)
    write_tree(
        ws, post_deletion(CORE_ORIGINAL), 'from minipkg.core import top_token\n\n__all__ = ["top_token"]\n'
    )
    git(ws, "init", "-q")
    git(ws, "add", "-A")
    git(ws, "commit", "-qm", "task")
    (task_dir / "gold.patch").write_text(patch)
    if with_env:
        make_light_env(task_dir / "env", ws, base_site)
    task = Task(
        id=task_id,
        source=str(tmp / "src"),
        level=2,
        package="minipkg",
        feature=Feature(qualname="minipkg.core.merge_counts", path="minipkg/core.py", kind="function"),
        statement="Implement minipkg.core.merge_counts(first, second, *, floor=0).",
        fail_to_pass=["tests/test_core.py::test_merge_counts"],
        pass_to_pass=["tests/test_core.py::test_top_token"],
    )
    save_task(task_dir, task)
    return task_dir


def original_tree(dest: Path) -> Path:
    write_tree(dest, CORE_ORIGINAL, INIT_ORIGINAL)
    return dest


PY = f"python{sys.version_info.major}.{sys.version_info.minor}"
