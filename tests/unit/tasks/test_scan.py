"""Leak scan and scrub: every channel planted into a real task is found; a clean task gives nothing."""

from __future__ import annotations

import io
import json
import py_compile
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from cadenza.tasks.leaks.scan import find_task_dirs, scan_tasks, task_secret
from cadenza.tasks.leaks.scrub import scrub_env, scrub_workspace
from tests.support.taskfixture import CORE_ORIGINAL, INIT_ORIGINAL, PY, git, make_task, original_tree


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    return make_task(tmp_path_factory.mktemp("tpl"))


@pytest.fixture
def task(template, tmp_path) -> Path:
    dest = tmp_path / template.name
    shutil.copytree(template, dest, symlinks=True)
    return dest


def _site(task_dir: Path) -> Path:
    return task_dir / "env" / "lib" / PY / "site-packages"


def _wheel_bytes() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("minipkg/__init__.py", INIT_ORIGINAL)
        zf.writestr("minipkg/core.py", CORE_ORIGINAL)
        zf.writestr("minipkg-1.0.dist-info/RECORD", "minipkg/core.py,,\n")
    return buf.getvalue()


def _sdist_bytes() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        data = CORE_ORIGINAL.encode()
        info = tarfile.TarInfo("minipkg-1.0/minipkg/core.py")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def plant_git_history(t: Path, tmp: Path) -> None:
    ws = t / "workspace"
    shutil.rmtree(ws / ".git")
    (ws / "minipkg" / "core.py").rename(tmp / "post.py")
    original_tree(ws)
    git(ws, "init", "-q")
    git(ws, "add", "-A")
    git(ws, "commit", "-qm", "original")
    shutil.copy(tmp / "post.py", ws / "minipkg" / "core.py")
    git(ws, "commit", "-qam", "delete feature")


def plant_git_reflog(t: Path, tmp: Path) -> None:
    """One commit left, but the amended original still sits in objects/reflog."""
    ws = t / "workspace"
    post = (ws / "minipkg" / "core.py").read_text()
    (ws / "minipkg" / "core.py").write_text(CORE_ORIGINAL)
    git(ws, "commit", "-qam", "original")
    (ws / "minipkg" / "core.py").write_text(post)
    git(ws, "reset", "-q", "--soft", "HEAD~1")
    git(ws, "commit", "-q", "--amend", "-am", "task")


def plant_git_stash(t: Path, tmp: Path) -> None:
    ws = t / "workspace"
    (ws / "minipkg" / "core.py").write_text(CORE_ORIGINAL)
    git(ws, "stash", "-q")


def plant_git_dangling_pack(t: Path, tmp: Path) -> None:
    """A packed blob no ref reaches (what 'git gc' leaves behind)."""
    ws = t / "workspace"
    (tmp / "blob.py").write_text(CORE_ORIGINAL)
    git(ws, "hash-object", "-w", str(tmp / "blob.py"))
    git(ws, "repack", "-q", "-a", "-k")


def plant_pycache(t: Path, tmp: Path) -> None:
    src = original_tree(tmp / "orig")
    cache = t / "workspace" / "minipkg" / "__pycache__"
    cache.mkdir()
    py_compile.compile(
        str(src / "minipkg" / "core.py"),
        cfile=str(cache / f"core.cpython-{sys.version_info.major}{sys.version_info.minor}.pyc"),
        doraise=True,
    )


def plant_pyc_code_only(t: Path, tmp: Path) -> None:
    """Bytecode without docstrings (-OO): only the compiled code object gives it away."""
    src = original_tree(tmp / "orig")
    out = t / "workspace" / "minipkg" / "stale.pyc"
    py_compile.compile(str(src / "minipkg" / "core.py"), cfile=str(out), doraise=True, optimize=2)


def plant_mypy_cache(t: Path, tmp: Path) -> None:
    d = t / "workspace" / ".mypy_cache" / "3.11" / "minipkg"
    d.mkdir(parents=True)
    (d / "core.data.json").write_text(
        json.dumps({".class": "MypyFile", "_fullname": "minipkg.core", "source": CORE_ORIGINAL})
    )


def plant_egg_info(t: Path, tmp: Path) -> None:
    d = t / "workspace" / "minipkg.egg-info"
    d.mkdir()
    body = "\n".join("        " + ln for ln in CORE_ORIGINAL.splitlines())
    (d / "PKG-INFO").write_text(f"Metadata-Version: 2.1\nName: minipkg\nDescription: Example::\n\n{body}\n")
    (d / "SOURCES.txt").write_text("minipkg/core.py\n")


def plant_build_copy(t: Path, tmp: Path) -> None:
    d = t / "workspace" / "build" / "lib" / "minipkg"
    d.mkdir(parents=True)
    (d / "core.py").write_text(CORE_ORIGINAL)


def plant_site_packages(t: Path, tmp: Path) -> None:
    site = _site(t)
    (site / "minipkg").mkdir()
    (site / "minipkg" / "core.py").write_text(CORE_ORIGINAL)
    dist = site / "minipkg-1.0.dist-info"
    dist.mkdir()
    (dist / "RECORD").write_text("minipkg/core.py,,\n")
    (dist / "METADATA").write_text("Name: minipkg\nVersion: 1.0\n")


def plant_pip_cache_wheel(t: Path, tmp: Path) -> None:
    d = t / "env" / ".cache" / "pip" / "wheels" / "ab" / "cd"
    d.mkdir(parents=True)
    (d / "minipkg-1.0-py3-none-any.whl").write_bytes(_wheel_bytes())


def plant_pip_cache_sdist(t: Path, tmp: Path) -> None:
    d = t / "env" / "pip-cache" / "http-v2" / "a" / "b"
    d.mkdir(parents=True)
    (d / "0123abcd.body").write_bytes(_sdist_bytes())


def plant_pth_target(t: Path, tmp: Path) -> None:
    """A .pth in the env reaches a directory outside the task holding the original."""
    outside = original_tree(tmp / "elsewhere")
    (_site(t) / "zz_extra.pth").write_text(str(outside) + "\n")


def plant_docs(t: Path, tmp: Path) -> None:
    d = t / "workspace" / "docs"
    d.mkdir()
    body = "\n".join("   " + ln for ln in CORE_ORIGINAL.splitlines())
    (d / "api.rst").write_text(f"API\n===\n\n.. code-block:: python\n\n{body}\n")


def plant_stub(t: Path, tmp: Path) -> None:
    (t / "workspace" / "minipkg" / "core.pyi").write_text(
        "from typing import Mapping, overload\n\n@overload\ndef merge_counts(first: None, second: None) -> "
        "dict[str, int]: ...\n"
        "@overload\ndef merge_counts(first: Mapping[str, int], second: Mapping[str, int], *, floor: int = "
        "...) -> dict[str, int]: ...\n"
        "def top_token(counts: Mapping[str, int]) -> str: ...\n"
    )


def plant_stub_wheel(t: Path, tmp: Path) -> None:
    """A stubs-only wheel (no source at all) dropped into the environment."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(
            "minipkg-stubs/core.pyi",
            "def merge_counts(first: dict, second: dict, *, floor: int = ...) -> dict: ...\n",
        )
    (t / "env" / "minipkg_stubs-1.0-py3-none-any.whl").write_bytes(buf.getvalue())


def plant_symlink_out(t: Path, tmp: Path) -> None:
    outside = original_tree(tmp / "linked")
    (t / "workspace" / "vendor").symlink_to(outside)


CHANNELS = {
    "git-history": (plant_git_history, "git"),
    "git-reflog": (plant_git_reflog, "git"),
    "git-stash": (plant_git_stash, "git"),
    "git-dangling-pack": (plant_git_dangling_pack, "git"),
    "pycache": (plant_pycache, "bytecode"),
    "pyc-code-object": (plant_pyc_code_only, "bytecode"),
    "mypy-cache": (plant_mypy_cache, "mypy-cache"),
    "egg-info": (plant_egg_info, "egg-info"),
    "build-dir": (plant_build_copy, "build-dir"),
    "site-packages": (plant_site_packages, "site-packages"),
    "pip-cache-wheel": (plant_pip_cache_wheel, "pip-cache"),
    "pip-cache-sdist": (plant_pip_cache_sdist, "pip-cache"),
    "pth-target": (plant_pth_target, None),
    "docs": (plant_docs, "docs"),
    "stub": (plant_stub, "stub"),
    "symlink-out": (plant_symlink_out, None),
    "stub-in-wheel": (plant_stub_wheel, "archive"),
}


def test_clean_task_has_no_findings(task):
    assert scan_tasks([task]) == []
    secret = task_secret(task)
    assert secret.needles, "the deleted code must yield distinctive lines"
    assert "def top_token(counts):" not in secret.needles  # kept code is never a needle


@pytest.mark.parametrize("name", sorted(CHANNELS))
def test_scan_finds_planted_channel(task, tmp_path, name):
    plant, channel = CHANNELS[name]
    plant(task, tmp_path)
    findings = scan_tasks([task])
    assert findings, f"{name}: planted leak not found"
    if channel is not None:
        assert channel in {f.channel for f in findings}, findings


@pytest.mark.slow  # over 10 s on 2 cores: in make test, not make test-fast
def test_cli_scan_exit_codes(task, tmp_path):
    cmd = [sys.executable, "-m", "cadenza", "tasks", "scan", str(task)]
    clean = subprocess.run(cmd, capture_output=True, text=True)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    plant_pycache(task, tmp_path)
    leaky = subprocess.run(cmd, capture_output=True, text=True)
    assert leaky.returncode == 1 and "bytecode" in leaky.stdout, leaky.stdout + leaky.stderr


def test_scrub_closes_every_channel(task, tmp_path):
    """Plant every workspace and in-env channel at once; scrub; the scan is clean and the code kept."""
    for i, name in enumerate(sorted(CHANNELS)):
        if name != "pth-target":  # a shared dir outside the task: the scan rejects, scrub cannot own it
            sub = tmp_path / f"p{i}"
            sub.mkdir()
            CHANNELS[name][0](task, sub)
    assert len({f.channel for f in scan_tasks([task])}) >= 9
    secret = task_secret(task)
    scrub_workspace(task / "workspace", secret)
    scrub_env(task / "env", "minipkg", secret)
    assert scan_tasks([task]) == []
    ws = task / "workspace"
    assert git(ws, "rev-list", "--all", "--count").strip() == "1"
    assert git(ws, "stash", "list").strip() == ""
    assert "def top_token" in (ws / "minipkg" / "core.py").read_text()  # the kept code survives
    stub = (ws / "minipkg" / "core.pyi").read_text()
    assert "def top_token" in stub and "merge_counts" not in stub  # every overload goes, other stubs stay
    assert (ws / "tests" / "test_core.py").is_file()


def test_scrub_git_is_deterministic(template, tmp_path):
    heads = []
    for i in range(2):
        dest = tmp_path / f"c{i}"
        shutil.copytree(template, dest, symlinks=True)
        scrub_workspace(dest / "workspace", task_secret(dest))
        heads.append(git(dest / "workspace", "rev-parse", "HEAD").strip())
        assert not (dest / "workspace" / ".git" / "logs").exists()
    assert heads[0] == heads[1]


def test_task_set_scan_and_bad_paths(template, tmp_path):
    shutil.copytree(template, tmp_path / "set" / "a", symlinks=True)
    shutil.copytree(template, tmp_path / "set" / "b", symlinks=True)
    plant_build_copy(tmp_path / "set" / "b", tmp_path)
    assert len(find_task_dirs(tmp_path / "set")) == 2
    findings = scan_tasks(find_task_dirs(tmp_path / "set"))
    assert {f.path.split("/set/")[1].split("/")[0] for f in findings} == {"b"}
    for bad in (tmp_path / "nope", tmp_path / "set" / "a" / "workspace"):
        res = subprocess.run(
            [sys.executable, "-m", "cadenza", "tasks", "scan", str(bad)], capture_output=True, text=True
        )
        assert (
            res.returncode == 2
            and res.stderr.startswith("error:")
            and len(res.stderr.strip().splitlines()) == 1
        )


def test_statement_may_quote_docstring_but_not_code(task):
    from cadenza.tasks.records.task import load_task, save_task

    t = load_task(task)
    t.statement += "\nMerge two count mappings, dropping totals at or below the floor.\n"
    save_task(task, t)
    assert scan_tasks([task]) == []
    t.statement += (
        "\n    survivors = {tok: n for tok, n in combined.items() if n > floor}\n    combined = "
        "Counter(first)\n"
    )
    save_task(task, t)
    assert [f.channel for f in scan_tasks([task])] == ["statement"]
    t.statement = t.statement.replace(
        "combined = Counter(first)", "def merge_counts(first, second, *, floor=0):"
    )
    t.statement = t.statement.replace(
        "    survivors = {tok: n for tok, n in combined.items() if n > floor}\n", ""
    )
    save_task(task, t)
    assert scan_tasks([task]) == []  # a signature is what the statement is meant to give


def test_needles_skip_generic_lines_and_know_wrapped_signatures(tmp_path):
    from cadenza.tasks.leaks.secret import candidate_lines, derive_secret

    assert candidate_lines(
        [
            "import types",
            "from typing import Any",
            "    return None",
            "if __name__ == '__main__':",
            "    total = first_value + second_value",
        ]
    ) == {"total = first_value + second_value"}
    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    (ws / "pkg" / "m.py").write_text("X = 1\n")
    patch = (
        "diff --git a/pkg/m.py b/pkg/m.py\n--- a/pkg/m.py\n+++ b/pkg/m.py\n@@ -1 +1,8 @@\n X = 1\n"
        "+def update_many(\n+    self,\n+    updates: Iterable[Tuple[Mapping, QueryLike]],\n+) -> "
        "List[int]:\n"
        "+    applied = [self._apply(u) for u in updates]\n+    self._journal.extend(applied)\n+    return "
        "applied\n"
    )
    secret = derive_secret("t", ws, patch)
    assert "updates: Iterable[Tuple[Mapping, QueryLike]]," in secret.signature_lines
    assert "self._journal.extend(applied)" in secret.needles - secret.signature_lines


def _secret_deleting(tmp_path: Path, body: list[str]):
    """The secret of a task whose gold patch adds ``body`` back after ``X = 1`` in ``pkg/m.py``."""
    from cadenza.tasks.leaks.secret import derive_secret

    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    (ws / "pkg" / "m.py").write_text("X = 1\n")
    patch = (
        "diff --git a/pkg/m.py b/pkg/m.py\n--- a/pkg/m.py\n+++ b/pkg/m.py\n"
        f"@@ -1 +1,{len(body) + 1} @@\n X = 1\n" + "".join(f"+{ln}\n" for ln in body)
    )
    return derive_secret("t", ws, patch)


def test_generic_lines_that_occur_in_any_env_are_no_evidence(tmp_path):
    """A deleted block whose only shared lines with a third-party package are generic ones
    (``except AttributeError:``) is not a leak; its distinctive lines still are."""
    from cadenza.tasks.leaks.scan import scan_paths

    body = [
        "def naturaldelta(value):",
        "    try:",
        "        seconds = abs(value.total_seconds())",
        "    except AttributeError:",
        "        return isinstance(other, type(self))",
        "    return _format_delta(seconds, months_per_year=12)",
    ]
    secret = _secret_deleting(tmp_path, body)
    assert "except AttributeError:" not in secret.needles
    assert "return isinstance(other, type(self))" not in secret.needles
    assert "seconds = abs(value.total_seconds())" in secret.needles
    site = tmp_path / "env" / "site-packages" / "dateutil"
    site.mkdir(parents=True)
    (site / "tz.py").write_text(
        "try:\n    pass\nexcept AttributeError:\n    return isinstance(other, type(self))\n"
    )
    assert scan_paths([(tmp_path / "env", secret)]) == []  # generic lines only: no finding
    (site / "copy.py").write_text("\n".join(body) + "\n")
    findings = scan_paths([(tmp_path / "env", secret)])
    assert [Path(f.path).name for f in findings] == ["copy.py"]  # the real copy still is


def test_lines_a_third_party_package_also_holds_are_no_evidence(tmp_path):
    """Beyond the keyword heuristic: a deleted line that a package of the environment contains too
    (here ``return self._cache[key]``) is dropped from the needles; distinctive lines and an installed
    copy of the patched module still count."""
    from cadenza.tasks.leaks.scan import distinctive_in, scan_paths

    body = [
        "def lookup_cached(self, key):",
        "    if key not in self._cache:",
        "        self._cache[key] = self._compute_slowly(key, retries=3)",
        "        self._misses_by_key.setdefault(key, 0)",
        "        self._misses_by_key[key] += 1",
        "    return self._cache[key]",
    ]
    secret = _secret_deleting(tmp_path, body)
    shared = {"    if key not in self._cache:", "    return self._cache[key]"}
    assert {ln.strip() for ln in shared} <= secret.needles  # not generic by the keyword heuristic
    env = tmp_path / "env"
    (env / "thirdparty").mkdir(parents=True)
    (env / "thirdparty" / "memo.py").write_text(
        "class Memo:\n    def get(self, key):\n" + "\n".join(shared) + "\n"
    )
    assert [Path(f.path).name for f in scan_paths([(env, secret)])] == ["memo.py"]  # the false alarm
    clean = distinctive_in(secret, [env])
    assert clean.needles == secret.needles - {ln.strip() for ln in shared}
    assert "self._cache[key] = self._compute_slowly(key, retries=3)" in clean.needles
    assert scan_paths([(env, clean)]) == []
    copy = tmp_path / "env2"
    (copy / "thirdparty").mkdir(parents=True)
    (copy / "thirdparty" / "memo.py").write_text((env / "thirdparty" / "memo.py").read_text())
    (copy / "pkg").mkdir()
    (copy / "pkg" / "m.py").write_text("\n".join(body) + "\n")  # an installed copy of the package
    clean2 = distinctive_in(secret, [copy])
    assert clean2.needles == clean.needles  # the copy's lines are not reference material
    assert [Path(f.path).name for f in scan_paths([(copy, clean2)])] == ["m.py"]
