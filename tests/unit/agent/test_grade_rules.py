"""Grading rules without running pytest: what is kept, what is dropped, JUnit node mapping, patch replay."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from cadenza.agent.grading.diff import compare
from cadenza.agent.grading.grade import _merge_pyproject, apply_changes
from cadenza.agent.grading.policy import GradePolicy
from cadenza.agent.replay import patch_actions
from cadenza.agent.tools import Toolbox
from cadenza.sandbox import Sandbox, SandboxConfig

POLICY = GradePolicy(
    test_paths=frozenset({"tests/test_a.py", "checks/verify.py"}),
    shadowable=frozenset({"json", "pytest", "_pytest"}),
    pristine_top=frozenset({"pkg", "tests"}),
)


@pytest.mark.parametrize(
    "rel,kind,reason",
    [
        ("pkg/core.py", "file", None),
        ("pkg/new_helper.py", "file", None),
        ("README.md", "file", None),
        ("tests/test_a.py", "file", "test file"),
        ("tests/helpers.py", "file", "test file"),
        ("checks/verify.py", "file", "test file"),
        ("pkg/test_core.py", "file", "test file"),
        ("pkg/conftest.py", "file", "conftest"),
        ("conftest.py", "file", "conftest"),
        ("pytest.ini", "file", "pytest configuration"),
        ("sub/tox.ini", "file", "pytest configuration"),
        ("setup.cfg", "file", "pytest configuration"),
        ("pytest.toml", "file", "pytest configuration"),
        ("sitecustomize.py", "file", "start-up"),
        ("pkg/usercustomize.py", "file", "start-up"),
        ("pkg/x.pth", "file", ".pth"),
        ("pytest.py", "file", "shadow"),
        ("json/__init__.py", "file", "shadow"),
        ("src/_pytest/x.py", "file", "shadow"),
        ("pkg/json.py", "file", None),
        ("pkg/link.py", "link", "symlink"),
        ("evil-0.1.dist-info/entry_points.txt", "file", "packaging metadata"),
        ("evil-0.1.dist-info/METADATA", "file", "packaging metadata"),
        ("src/evil.egg-info/PKG-INFO", "file", "packaging metadata"),
        ("pkg/entry_points.txt", "file", "packaging metadata"),
        ("pkg/metadata.py", "file", None),  # a module named like metadata is source
    ],
)
def test_policy(rel: str, kind: str, reason: str | None):
    got = POLICY.reason_to_drop(rel, kind)
    assert (got is None) if reason is None else (got is not None and reason in got), got


def test_apply_changes_on_fresh_copy(tmp_path: Path):
    pristine, agent, dest = tmp_path / "p", tmp_path / "a", tmp_path / "d"
    for root in (pristine, agent, dest):
        (root / "pkg").mkdir(parents=True)
        (root / "tests").mkdir()
        (root / "pkg/core.py").write_text("x = 1\n")
        (root / "pkg/old.py").write_text("old\n")
        (root / "tests/test_a.py").write_text("def test(): assert False\n")
        (root / ".git").mkdir()
    (agent / "pkg/core.py").write_text("x = 2\n")
    (agent / "pkg/old.py").unlink()
    (agent / "tests/test_a.py").write_text("def test(): pass\n")
    (agent / "conftest.py").write_text("")
    (pristine / "setup.cfg").write_text("[tool:pytest]\n")
    (dest / "setup.cfg").write_text("[tool:pytest]\n")
    (agent / ".git/HEAD").write_text("tampered")
    (agent / "pkg/__pycache__").mkdir()
    (agent / "pkg/__pycache__/core.cpython-311.pyc").write_bytes(b"\0")
    changes = compare(pristine, agent)
    assert changes.modified == ["pkg/core.py", "tests/test_a.py"] and changes.added == ["conftest.py"]
    assert changes.deleted == ["pkg/old.py", "setup.cfg"]
    applied, dropped = apply_changes(pristine, agent, dest, POLICY)
    assert sorted(applied) == ["pkg/core.py", "pkg/old.py"]
    assert set(dropped) == {"tests/test_a.py", "conftest.py", "setup.cfg"}
    assert (
        dropped["setup.cfg"].startswith("deletion of pytest configuration") and (dest / "setup.cfg").exists()
    )
    assert (dest / "pkg/core.py").read_text() == "x = 2\n" and not (dest / "pkg/old.py").exists()
    assert (dest / "tests/test_a.py").read_text() == "def test(): assert False\n"
    assert not (dest / "conftest.py").exists() and not (dest / ".git/HEAD").exists()


def test_pyproject_keeps_agent_edits_but_restores_pytest_tables(tmp_path: Path):
    (tmp_path / "p.toml").write_text('[project]\nname = "x"\n[tool.pytest.ini_options]\naddopts = "-q"\n')
    (tmp_path / "a.toml").write_text(
        '[project]\nname = "x"\nversion = "2"\n[tool.pytest.ini_options]\naddopts = "-p evil"\n'
        '[tool.pytest_env]\nX = "1"\n'
    )
    merged = tomllib.loads(_merge_pyproject(tmp_path / "p.toml", tmp_path / "a.toml").decode())
    assert merged["project"]["version"] == "2"
    assert merged["tool"] == {"pytest": {"ini_options": {"addopts": "-q"}}}
    (tmp_path / "broken.toml").write_text("[[[")
    assert _merge_pyproject(tmp_path / "p.toml", tmp_path / "broken.toml") is None


def test_patch_actions_reproduce_the_patched_files(tmp_path: Path):
    import difflib

    before = {"m.py": "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\n", "n.py": "x\n"}
    after = {"m.py": "a\nB\nc\nd\ne\nf\ng\nh\nI\nj\nk\n", "n.py": "x\n", "new/o.py": "o = 1\n"}
    patch = ""
    for name in sorted(after):
        patch += "".join(
            difflib.unified_diff(
                before.get(name, "").splitlines(True),
                after[name].splitlines(True),
                f"a/{name}" if name in before else "/dev/null",
                f"b/{name}",
                n=1,
            )
        )
    ws = tmp_path / "ws"
    ws.mkdir()
    for name, text in before.items():
        (ws / name).write_text(text)
    box = Toolbox(ws, Sandbox(ws, config=SandboxConfig(no_sandbox=True)))
    actions = patch_actions(patch)
    assert [a["tool"] for a in actions] == ["str_replace", "str_replace", "create"]
    for a in actions:
        assert box.call(a["tool"], a["args"]).error_kind is None
    for name, text in after.items():
        assert (ws / name).read_text() == text


def test_doctest_node_files_stay_editable():
    from cadenza.agent.grading.policy import is_doctest
    from cadenza.tasks.records.task import Feature, Task

    assert is_doctest("pkg/mod.py::pkg.mod.func") and not is_doctest("tests/test_a.py::test_x[1.5]")
    assert not is_doctest("tests/test_a.py::TestX::test_y")
    task = Task(
        id="t",
        source="s",
        level=1,
        statement="",
        feature=Feature(qualname="pkg.mod.f", path="pkg/mod.py", kind="function"),
        fail_to_pass=["pkg/mod.py::pkg.mod.f", "checks/verify.py::test_f"],
        pass_to_pass=[],
    )
    policy = GradePolicy.for_task(task, shadowable=frozenset(), pristine_top=frozenset({"pkg", "checks"}))
    assert policy.reason_to_drop("pkg/mod.py", "file") is None
    assert policy.reason_to_drop("checks/verify.py", "file") == "test file"
