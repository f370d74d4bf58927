"""``cadenza replay`` end to end: the real CLI, a real task, real bubblewrap."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cadenza.agent.miniswe import to_mini_swe_agent
from cadenza.agent.replay import patch_actions
from cadenza.agent.trajectory import Trajectory
from tests.support.sandbox_fixtures import GOLD_PATCH

ROOT = Path(__file__).resolve().parents[3]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cadenza", *args], capture_output=True, text=True, cwd=ROOT, timeout=300
    )


def write_actions(path: Path, actions: list) -> Path:
    path.write_text("".join((a if isinstance(a, str) else json.dumps(a)) + "\n" for a in actions))
    return path


def test_replay_json_gold_and_bad_calls(task_dir: Path, tmp_path: Path):
    actions = [
        {"tool": "frobnicate", "args": {}},
        {"tool": "view", "args": "{not json"},
        {"tool": "view", "args": {"path": 3}},
        {"tool": "view", "args": {"path": "../../etc/passwd"}},
        *patch_actions(GOLD_PATCH),
        {"tool": "submit", "args": {}},
        {"tool": "bash", "args": {"command": "echo after submit"}},
    ]
    saved = tmp_path / "traj.json"
    res = cli(
        "replay",
        str(task_dir),
        str(write_actions(tmp_path / "a.jsonl", actions)),
        "--json",
        "--save",
        str(saved),
    )
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1
    out = json.loads(lines[0])
    assert set(out) == {"resolved", "reward", "f2p", "p2p", "flags", "turns"}
    assert out["resolved"] is True and out["reward"] == 1.0 and out["flags"] == []
    assert out["f2p"] == {"passed": 4, "total": 4} and out["p2p"] == {"passed": 3, "total": 3}
    assert out["turns"] == 6  # the call after submit is not run
    traj = Trajectory.load(saved)
    kinds = [t.error_kind for t in traj.turns]
    assert kinds == [
        "tool_not_found",
        "invalid_arguments",
        "invalid_arguments",
        "path_outside_workspace",
        None,
        None,
    ]
    tool_msgs = [m for m in traj.messages if m["role"] == "tool"]
    assert tool_msgs[0]["content"] == (
        "Error: tool 'frobnicate' not found. Available tools: "
        "bash, view, create, str_replace, insert, run_tests, submit"
    )
    assert (
        "not valid JSON" in tool_msgs[1]["content"]
        and "must be string, got integer" in tool_msgs[2]["content"]
    )
    assert traj.sandboxed is True
    # assistant messages carry OpenAI tool calls answered by tool messages with the same id
    first = traj.messages[traj.turns[0].message_index]
    assert first["tool_calls"][0]["function"]["name"] == "frobnicate"
    assert traj.messages[traj.turns[0].message_index + 1]["tool_call_id"] == first["tool_calls"][0]["id"]
    mini = to_mini_swe_agent(traj)
    assert mini["trajectory_format"] == "mini-swe-agent-1.1" and mini["info"]["exit_status"] == "Submitted"
    assert mini["messages"][first_index(traj)]["extra"]["error_kind"] == "tool_not_found"
    assert "+    return max(lo, min(x, hi))" in mini["info"]["submission"]
    json.dumps(mini)


def first_index(traj: Trajectory) -> int:
    return traj.turns[0].message_index


def test_replay_text_output_and_no_sandbox(task_dir: Path, tmp_path: Path):
    actions = write_actions(
        tmp_path / "a.jsonl",
        [{"tool": "create", "path": "x"}, {"tool": "create", "args": {"path": "conftest.py", "content": ""}}],
    )
    saved = tmp_path / "t.json"
    res = cli("replay", str(task_dir), str(actions), "--no-sandbox", "--save", str(saved))
    assert res.returncode == 0, res.stderr
    assert "resolved" in res.stdout and "conftest.py" in res.stdout
    assert Trajectory.load(saved).sandboxed is False


def test_replay_bad_input_is_one_line_error(task_dir: Path, tmp_path: Path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"tool": "bash", "args": {}}\nnot json\n')
    for args, needle in [
        ((str(task_dir), str(bad)), "line 2 is not valid JSON"),
        ((str(tmp_path / "nope"), str(bad)), "is not a task directory"),
        ((str(task_dir), str(tmp_path / "missing.jsonl")), "does not exist"),
    ]:
        res = cli("replay", *args, "--json")
        assert res.returncode == 2
        assert (
            res.stderr.startswith("error: ")
            and needle in res.stderr
            and len(res.stderr.strip().splitlines()) == 1
        )
        assert "Traceback" not in res.stderr
