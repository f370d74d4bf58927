"""Episode lifecycle: initial messages, budgets that end the episode, text-only replies, the outcome."""

from __future__ import annotations

import json
from pathlib import Path

from cadenza.agent.env import ToolCall
from cadenza.agent.episode import Episode, EpisodeConfig
from cadenza.agent.tools import TOOL_NAMES

LS = ToolCall(name="bash", arguments={"command": "ls"})


def test_reset_gives_system_prompt_with_tools_and_statement(task_dir: Path):
    with Episode(task_dir) as ep:
        messages = ep.reset()
        assert [m["role"] for m in messages] == ["system", "user"]
        assert all(f'"name": "{name}"' in messages[0]["content"] for name in TOOL_NAMES)
        assert "clamp" in messages[1]["content"]
        assert ep.workspace is not None and not ep.workspace.is_relative_to(task_dir.parent)
        assert json.loads(json.dumps(ep.tools()))[0]["function"]["name"] == "bash"
        workspace = ep.workspace
    assert not workspace.exists()  # the copy is removed on close


def test_max_turns_and_token_budget_end_the_episode(task_dir: Path):
    with Episode(task_dir, EpisodeConfig(max_turns=2)) as ep:
        ep.reset()
        assert ep.step(LS).done is False
        last = ep.step(LS)
        assert (
            last.done and last.info["end_reason"] == "max_turns" and "max turns reached" in last.observation
        )
        after = ep.step(LS)
        assert after.done and after.error_kind == "tool_error" and len(ep.trajectory.turns) == 2
    with Episode(task_dir, EpisodeConfig(token_budget=10)) as ep:
        ep.reset()
        assert ep.step(LS, tokens=6).done is False
        assert ep.step(LS, token_ids=[1, 2, 3, 4, 5]).info["end_reason"] == "token_budget"
        assert ep.trajectory.turns[1].token_ids == [1, 2, 3, 4, 5]


def test_time_budget_and_text_only_reply(task_dir: Path):
    with Episode(task_dir, EpisodeConfig(time_budget_s=0.0)) as ep:
        ep.reset()
        res = ep.respond("I think I am done.")
        assert res.error_kind == "no_tool_call" and res.done and res.info["end_reason"] == "time_budget"
        assert ep.trajectory.messages[-2] == {"role": "assistant", "content": "I think I am done."}
        assert (
            ep.trajectory.messages[-1]["role"] == "user"
            and "no tool call" in ep.trajectory.messages[-1]["content"]
        )


def test_finish_without_changes_is_unresolved(task_dir: Path):
    with Episode(task_dir) as ep:
        ep.reset()
        ep.step(ToolCall(name="submit", arguments={}))
        outcome = ep.finish()
    assert outcome["resolved"] is False and outcome["reward"] == 0.0 and outcome["end_reason"] == "submit"
    assert outcome["f2p"] == {"passed": 0, "total": 4} and outcome["p2p"] == {"passed": 3, "total": 3}
    assert set(outcome["grade"]["tests"].values()) == {"passed", "failed"}


def test_a_command_cannot_outlast_the_time_budget(task_dir: Path):
    with Episode(task_dir, EpisodeConfig(time_budget_s=3.0)) as ep:
        ep.reset()
        res = ep.step(ToolCall(name="bash", arguments={"command": "sleep 60"}))
        assert res.error_kind == "timeout" and res.done and res.info["end_reason"] == "time_budget"
        assert ep.trajectory.turns[-1].duration_s < 10


def test_edit_turns_record_the_file_before_and_after_for_style_feedback(task_dir: Path):
    from cadenza.feedback.style import style

    with Episode(task_dir) as ep:
        ep.reset()
        ep.step(
            ToolCall(name="create", arguments={"path": "calc/extra.py", "content": "import os\n\nX = 1\n"})
        )
        ep.step(
            ToolCall(name="str_replace", arguments={"path": "calc/extra.py", "old": "X = 1", "new": "X = 2"})
        )
        ep.step(ToolCall(name="create", arguments={"path": "notes.txt", "content": "plain text\n"}))
        turns = ep.trajectory.turns
        assert turns[0].extra == {
            "path": "calc/extra.py",
            "content_before": "",
            "content_after": "import os\n\nX = 1\n",
        }
        assert turns[1].extra["content_before"] == "import os\n\nX = 1\n"
        assert turns[1].extra["content_after"] == "import os\n\nX = 2\n"
        assert turns[2].extra == {}  # not Python: nothing to lint
        hints = style(ep.trajectory)
    # The unused import was introduced by turn 0 only; turn 1 changed a line without adding a violation.
    assert [h.turn for h in hints] == [0] and "F401" in hints[0].text


def test_trajectory_records_the_pristine_package_capabilities(task_dir: Path):
    """The monitor allows what grading's capability check allows: the kinds the pristine package uses,
    which the episode records in the trajectory (a module that walks ``__mro__`` adds reflection)."""
    ep = Episode(task_dir)
    ep.reset()
    assert "reflection" not in ep.trajectory.meta["package_capabilities"]
    ep.close()
    pkg = next(p for p in (task_dir / "workspace").rglob("*.py") if "test" not in p.name)
    pkg.write_text(pkg.read_text() + "\n\ndef _bases(c):\n    return c.__mro__\n")
    ep = Episode(task_dir)
    ep.reset()
    assert "reflection" in ep.trajectory.meta["package_capabilities"]
    ep.close()
