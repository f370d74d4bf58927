"""Tool schemas, argument checking and the file tools (confinement, exact-match edits, binary files)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cadenza.agent.schema import check_arguments
from cadenza.agent.tools import TOOL_NAMES, TOOL_SCHEMAS, Toolbox, ToolsConfig
from cadenza.sandbox import Sandbox, SandboxConfig


@pytest.fixture
def box(tmp_path: Path) -> Toolbox:
    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    (ws / "pkg" / "mod.py").write_text("a = 1\nb = 2\na = 1\n")
    (ws / "blob.bin").write_bytes(b"\x89PNG\x00\x01\x02")
    (tmp_path / "secret.txt").write_text("secret")
    sandbox = Sandbox(ws, config=SandboxConfig(no_sandbox=True))
    return Toolbox(ws, sandbox, config=ToolsConfig(max_observation_bytes=2000))


def test_schemas_are_openai_function_tools():
    assert TOOL_NAMES == ["bash", "view", "create", "str_replace", "insert", "run_tests", "submit"]
    for tool in TOOL_SCHEMAS:
        assert tool["type"] == "function"
        params = tool["function"]["parameters"]
        assert params["type"] == "object" and set(params["required"]) <= set(params["properties"])


@pytest.mark.parametrize(
    "args,problem",
    [
        ("{bad", "not valid JSON"),
        ("[1]", "must be a JSON object"),
        ({}, "missing required argument 'path'"),
        ({"path": 1}, "'path' must be string, got integer"),
        ({"path": "x", "start_line": True}, "must be integer"),
        ({"path": "x", "nope": 1}, "unexpected argument 'nope'"),
    ],
)
def test_argument_errors(args, problem):
    params = TOOL_SCHEMAS[1]["function"]["parameters"]
    parsed, err = check_arguments(params, args)
    assert parsed is None and problem in err


def test_unknown_tool_and_invalid_arguments(box: Toolbox):
    res = box.call("grep", {"x": 1})
    assert res.error_kind == "tool_not_found"
    assert res.observation == f"Error: tool 'grep' not found. Available tools: {', '.join(TOOL_NAMES)}"
    res = box.call("view", '{"path": ')
    assert res.error_kind == "invalid_arguments" and 'Expected: {"path": string' in res.observation


def test_view_ranges_directories_and_binary(box: Toolbox):
    assert (
        box.call("view", {"path": "pkg/mod.py"}).observation
        == "     1\ta = 1\n     2\tb = 2\n     3\ta = 1\n"
    )
    assert box.call("view", {"path": "pkg/mod.py", "start_line": 2, "end_line": -1}).observation.startswith(
        "     2\tb = 2"
    )
    bad = box.call("view", {"path": "pkg/mod.py", "start_line": 9})
    assert bad.error_kind == "invalid_arguments" and "has 3 lines" in bad.observation
    assert "pkg/mod.py" in box.call("view", {"path": "."}).observation
    binary = box.call("view", {"path": "blob.bin"})
    assert binary.error_kind == "tool_error" and "binary file" in binary.observation
    assert "does not exist" in box.call("view", {"path": "nope.py"}).observation


def test_view_of_a_fifo_does_not_block(box: Toolbox):
    os.mkfifo(box.workspace / "pipe")
    res = box.call("view", {"path": "pipe"})
    assert res.error_kind == "tool_error" and "not a regular file" in res.observation


def test_str_replace_needs_exactly_one_match(box: Toolbox):
    res = box.call("str_replace", {"path": "pkg/mod.py", "old": "a = 1", "new": "a = 3"})
    assert (
        res.error_kind == "tool_error"
        and "occurs 2 times" in res.observation
        and "lines 1, 3" in res.observation
    )
    res = box.call("str_replace", {"path": "pkg/mod.py", "old": "zzz", "new": ""})
    assert res.error_kind == "tool_error" and "not found" in res.observation
    res = box.call("str_replace", {"path": "pkg/mod.py", "old": "b = 2", "new": "b = 20"})
    assert res.error_kind is None
    assert (box.workspace / "pkg/mod.py").read_text() == "a = 1\nb = 20\na = 1\n"


def test_insert_and_create(box: Toolbox):
    assert box.call("insert", {"path": "pkg/mod.py", "line": 0, "text": "# top"}).error_kind is None
    assert box.call("insert", {"path": "pkg/mod.py", "line": 4, "text": "c = 3\n"}).error_kind is None
    assert (box.workspace / "pkg/mod.py").read_text() == "# top\na = 1\nb = 2\na = 1\nc = 3\n"
    assert (
        box.call("insert", {"path": "pkg/mod.py", "line": 99, "text": "x"}).error_kind == "invalid_arguments"
    )
    res = box.call("create", {"path": "new/deep/file.py", "content": "x = 1\n"})
    assert res.error_kind is None and (box.workspace / "new/deep/file.py").read_text() == "x = 1\n"
    assert box.call("create", {"path": "pkg", "content": ""}).error_kind == "tool_error"


@pytest.mark.parametrize(
    "path", ["../secret.txt", "pkg/../../secret.txt", "/etc/passwd", "link/secret.txt", "flink"]
)
def test_paths_are_confined(box: Toolbox, path: str):
    os.symlink(box.workspace.parent, box.workspace / "link")
    os.symlink(box.workspace.parent / "secret.txt", box.workspace / "flink")
    for tool, extra in [
        ("view", {}),
        ("create", {"content": "pwned"}),
        ("str_replace", {"old": "secret", "new": "x"}),
        ("insert", {"line": 0, "text": "x"}),
    ]:
        res = box.call(tool, {"path": path, **extra})
        assert res.error_kind == "path_outside_workspace", (tool, res.observation)
    assert (box.workspace.parent / "secret.txt").read_text() == "secret"


def test_symlink_inside_workspace_is_fine(box: Toolbox):
    os.symlink("pkg/mod.py", box.workspace / "alias.py")
    assert box.call("view", {"path": "alias.py"}).error_kind is None


def test_huge_file_view_is_capped(box: Toolbox):
    (box.workspace / "big.py").write_text("x = 1\n" * 5000)
    res = box.call("view", {"path": "big.py"})
    assert len(res.observation.encode()) < 2200 and "bytes of output truncated" in res.observation
