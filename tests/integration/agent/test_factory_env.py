"""Tasks whose env lives inside the task directory and points back at its workspace (the factory's layout)."""

from __future__ import annotations

from pathlib import Path

from cadenza.agent.env import ToolCall
from cadenza.agent.episode import Episode
from cadenza.agent.replay import patch_actions, replay
from tests.support.sandbox_fixtures import GOLD_PATCH


def test_imports_follow_the_workspace_copy(chained_task_dir: Path):
    with Episode(chained_task_dir) as ep:
        ep.reset()
        res = ep.step(
            ToolCall(
                name="bash",
                arguments={
                    "command": "cd /tmp && python -c 'import calc, pytest; "
                    "print(calc.__file__)'; ls " + str(chained_task_dir)
                },
            )
        )
        lines = res.observation.splitlines()
        assert lines[0] == str(ep.workspace / "calc" / "__init__.py")
        assert lines[1:-1] == ["env"]  # the bound env is all there is of the task directory


def test_gold_replay_resolves_with_the_chained_env(chained_task_dir: Path):
    calls = [ToolCall(name=a["tool"], arguments=a["args"]) for a in patch_actions(GOLD_PATCH)]
    outcome, _ = replay(chained_task_dir, [*calls, ToolCall(name="submit", arguments={})])
    assert outcome.resolved is True and outcome.flags == []
    outcome, _ = replay(chained_task_dir, [ToolCall(name="submit", arguments={})])
    assert outcome.resolved is False and outcome.p2p[0] == 3


def test_doctest_nodes_grade_the_agents_module(taskset: Path):
    """F2P doctest items live in the source file the agent edits: its edits there must count."""
    import difflib
    import json

    from cadenza.agent.toytask import OPS_REMOVED, OPS_SOLVED

    task_dir = taskset / "calc-clamp"
    solved = OPS_SOLVED.replace(
        '    """Limit x to the closed interval [lo, hi]."""',
        '    """Limit x to the closed interval [lo, hi].\n\n    >>> clamp(7, 0, 5)\n    5\n    """',
    )
    patch = "".join(
        difflib.unified_diff(
            OPS_REMOVED.splitlines(True), solved.splitlines(True), "a/calc/ops.py", "b/calc/ops.py"
        )
    )
    data = json.loads((task_dir / "task.json").read_text())
    data["fail_to_pass"].append("calc/ops.py::calc.ops.clamp")
    data["pytest_args"] = ["-o", "addopts=--doctest-modules"]
    (task_dir / "task.json").write_text(json.dumps(data))
    calls = [ToolCall(name=a["tool"], arguments=a["args"]) for a in patch_actions(patch)]
    outcome, _ = replay(task_dir, [*calls, ToolCall(name="submit", arguments={})])
    assert outcome.resolved is True and outcome.f2p == (5, 5)
    assert outcome.grade["tests"]["calc/ops.py::calc.ops.clamp"] == "passed"
