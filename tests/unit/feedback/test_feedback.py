"""Hint generators: each kind fires where it should and stays silent where it should not."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from cadenza.agent.trajectory import Trajectory, TurnMeta
from cadenza.errors import ConfigError
from cadenza.feedback.critic import CriticConfig, critic
from cadenza.feedback.generate import FeedbackConfig, generate_hints, placebo_text
from cadenza.feedback.hints import Hint
from cadenza.feedback.placement import hinted_prefix
from cadenza.feedback.rules import invalid_arguments, repeated_failure, tool_not_found
from cadenza.feedback.style import new_violations, style

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "view",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "bash",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
        },
    },
]


def make_traj(turns: list[dict], observations: list[str] | None = None) -> Trajectory:
    """Messages: system, user, then per turn an assistant message and its tool result."""
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]
    metas = []
    for i, t in enumerate(turns):
        msgs.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": str(i),
                        "type": "function",
                        "function": {"name": t.get("tool"), "arguments": json.dumps(t.get("arguments"))},
                    }
                ],
            }
        )
        metas.append(TurnMeta(index=i, message_index=len(msgs) - 1, **t))
        msgs.append(
            {"role": "tool", "tool_call_id": str(i), "content": (observations or ["ok"] * len(turns))[i]}
        )
    return Trajectory(task_id="t", messages=msgs, turns=metas)


def test_tool_not_found_lists_tools_only_on_failing_turns():
    traj = make_traj(
        [
            {"tool": "view", "arguments": {"path": "a"}},
            {"tool": "cat", "arguments": {}, "error_kind": "tool_not_found"},
        ]
    )
    hints = tool_not_found(traj, TOOLS)
    assert hints == [
        Hint(turn=1, text="Reminder: the available tools are view, bash.", kind="tool_not_found")
    ]
    assert tool_not_found(make_traj([{"tool": "view", "arguments": {"path": "a"}}]), TOOLS) == []


def test_invalid_arguments_gives_that_tools_schema():
    traj = make_traj(
        [
            {"tool": "bash", "arguments": {"command": "ls"}, "error_kind": "invalid_arguments"},
            {"tool": "view", "arguments": {"path": "a"}},
        ]
    )
    (h,) = invalid_arguments(traj, TOOLS)
    assert h.turn == 0 and h.kind == "invalid_arguments"
    schema = json.loads(h.text.split("JSON schema: ", 1)[1])
    assert schema == TOOLS[1]["function"]["parameters"]
    # an unknown tool with bad arguments has no schema to show
    assert (
        invalid_arguments(
            make_traj([{"tool": "zzz", "arguments": {}, "error_kind": "invalid_arguments"}]), TOOLS
        )
        == []
    )


def test_repeated_failure_needs_same_command_and_same_result():
    same = {"tool": "bash", "arguments": {"cmd": "pytest"}, "exit_code": 1}
    traj = make_traj([same, same, same], ["FAILED x", "FAILED x", "FAILED x"])
    hints = repeated_failure(traj)
    assert [h.turn for h in hints] == [1, 2] and "turn 0" in hints[0].text
    # rerun after the failure changed (e.g. an edit in between) is legitimate
    assert repeated_failure(make_traj([same, same], ["FAILED x", "FAILED y"])) == []
    # the same command succeeding is fine
    ok = {"tool": "bash", "arguments": {"cmd": "pytest"}, "exit_code": 0}
    assert repeated_failure(make_traj([ok, ok], ["passed", "passed"])) == []
    # different arguments are a different command
    other = {"tool": "bash", "arguments": {"cmd": "pytest -x"}, "exit_code": 1}
    assert repeated_failure(make_traj([same, other], ["FAILED x", "FAILED x"])) == []
    assert [h.turn for h in repeated_failure(traj, min_repeats=3)] == [2]


def test_style_reports_only_newly_introduced_ruff_violations():
    before = "import os\n\n\ndef f(x):\n    return os.path.join(x)\n"
    # moves existing code down (line shift), adds an unused import and a `== None` comparison
    after = (
        "import os\nimport sys\n\n\ndef f(x):\n    if x == None:\n        return None\n    return "
        "os.path.join(x)\n"
    )
    found = new_violations(before, after, "m.py")
    assert sorted(v.code for v in found) == ["E711", "F401"]
    assert {v.line for v in found} == {2, 6}
    edit = {"path": "pkg/m.py", "content_before": before, "content_after": after}
    traj = make_traj(
        [
            {"tool": "edit", "arguments": {}, "extra": edit},
            {"tool": "edit", "arguments": {}, "extra": {**edit, "content_before": after}},
        ]
    )
    (h,) = style(traj)
    assert h.turn == 0 and "F401 line 2" in h.text and "E711 line 6" in h.text and "pkg/m.py" in h.text
    # pre-existing violations only shifted by an edit are not blamed on it
    assert new_violations("import sys\n", "\n\nimport sys\n", "m.py") == []
    # non-Python files and failed edits are skipped
    txt = {"path": "notes.txt", "content_before": "", "content_after": "import sys\n"}
    failed = {"tool": "edit", "arguments": {}, "extra": edit, "error_kind": "tool_error"}
    assert style(make_traj([{"tool": "edit", "arguments": {}, "extra": txt}, failed])) == []


def test_placement_user_before_turn_and_append_to_observation():
    traj = make_traj(
        [
            {"tool": "view", "arguments": {"path": "a"}},
            {"tool": "cat", "arguments": {}, "error_kind": "tool_not_found"},
        ]
    )
    hint = Hint(turn=1, text="Reminder: x", kind="tool_not_found")
    target = traj.turns[1].message_index
    a = hinted_prefix(traj.messages, target, [hint])
    assert a[:-1] == traj.messages[:target] and a[-1] == {"role": "user", "content": "Reminder: x"}
    b = hinted_prefix(traj.messages, target, [hint], "append_to_observation")
    assert len(b) == target and b[-1]["role"] == "tool" and b[-1]["content"] == "ok\n\nReminder: x"
    assert traj.messages[target - 1]["content"] == "ok"  # original untouched
    with pytest.raises(ConfigError, match="placement"):
        hinted_prefix(traj.messages, target, [hint], "somewhere")
    with pytest.raises(ConfigError, match="outside the trajectory"):
        hinted_prefix(traj.messages, 99, [hint])


def test_generate_hints_combines_kinds_and_placebo_keeps_length():
    traj = make_traj(
        [
            {"tool": "cat", "arguments": {}, "error_kind": "tool_not_found"},
            {"tool": "bash", "arguments": {"c": 1}, "error_kind": "invalid_arguments"},
        ]
    )
    cfg = FeedbackConfig(kinds=["tool_not_found", "invalid_arguments"])
    hints = generate_hints(traj, TOOLS, cfg)
    assert [(h.turn, h.kind) for h in hints] == [(0, "tool_not_found"), (1, "invalid_arguments")]
    placebo = generate_hints(traj, TOOLS, FeedbackConfig(kinds=["tool_not_found"], placebo=True))
    (p,) = placebo
    assert p.turn == 0 and "view" not in p.text and "bash" not in p.text
    assert 0 <= len(p.text) - len(hints[0].text) <= 12
    words = lambda s: len(s.split())  # noqa: E731 - a token counter stand-in
    assert words(placebo_text(hints[0].text, words)) == words(hints[0].text)
    assert (
        len(
            generate_hints(
                traj, TOOLS, FeedbackConfig(kinds=["tool_not_found", "invalid_arguments"], max_hints=1)
            )
        )
        == 1
    )
    with pytest.raises(ConfigError, match="unknown kinds"):
        FeedbackConfig(kinds=["nope"]).validate()
    with pytest.raises(ConfigError, match="critic"):
        FeedbackConfig(kinds=["critic"]).validate()


class _Critic(BaseHTTPRequestHandler):
    replies: list[str] = []
    seen: list[dict] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Critic.seen.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
        reply = _Critic.replies.pop(0)
        if reply == "500":
            self.send_response(500)
            self.end_headers()
            return
        data = json.dumps({"choices": [{"message": {"role": "assistant", "content": reply}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_llm_critic_over_openai_compatible_http(monkeypatch):
    server = HTTPServer(("127.0.0.1", 0), _Critic)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("CRITIC_KEY", "k123")
        cfg = CriticConfig(
            base_url=f"http://127.0.0.1:{server.server_port}/v1", model="judge", api_key_env="CRITIC_KEY"
        )
        traj = make_traj(
            [{"tool": "view", "arguments": {"path": "a"}}, {"tool": "view", "arguments": {"path": "a"}}]
        )
        _Critic.replies[:] = [
            'Sure: [{"turn": 1, "hint": "You already read a; edit it."}, '
            '{"turn": 7, "hint": "no such turn"}, {"turn": "x"}]',
            "500",
        ]
        hints = critic(traj, cfg)
        assert hints == [Hint(turn=1, text="You already read a; edit it.", kind="critic")]
        req = _Critic.seen[-1]
        assert (
            req["path"] == "/v1/chat/completions"
            and req["auth"] == "Bearer k123"
            and req["body"]["model"] == "judge"
        )
        assert "[turn 1] assistant" in req["body"]["messages"][1]["content"]
        errors: list[str] = []
        assert critic(traj, cfg, errors) == [] and "failed" in errors[0]
    finally:
        server.shutdown()
    # unreachable endpoint: no hints, an error recorded, no exception
    errors = []
    dead = CriticConfig(base_url="http://127.0.0.1:9/v1", model="m", timeout_s=2)
    assert critic(traj, dead, errors) == [] and errors
