"""Build trajectories by hand for monitor tests."""

from __future__ import annotations

import json
from typing import Any

from cadenza.agent.trajectory import Trajectory, TurnMeta
from cadenza.tasks.records.task import Feature, Task


def traj(*calls: tuple[str, dict[str, Any]]) -> Trajectory:
    """One assistant turn per ``(tool, args)``, in OpenAI message format, with matching turn metadata."""
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]
    turns = []
    for i, (tool, args) in enumerate(calls):
        turns.append(TurnMeta(index=i, message_index=len(msgs), tool=tool, arguments=args))
        call = {"id": f"c{i}", "type": "function", "function": {"name": tool, "arguments": json.dumps(args)}}
        msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": "ok"})
    return Trajectory(task_id="t", messages=msgs, turns=turns)


def bash(*commands: str) -> Trajectory:
    return traj(*[("bash", {"command": c}) for c in commands])


def sample_task() -> Task:
    return Task(
        id="mypkg-core-scale",
        source="local:mypkg",
        package="mypkg",
        feature=Feature(qualname="mypkg.core.scale", path="src/mypkg/core.py", kind="function"),
        level=1,
        statement="Implement mypkg.core.scale.",
        fail_to_pass=["tests/test_core.py::test_scale"],
        pass_to_pass=["tests/test_util.py::test_ok"],
        test_files=["tests/test_core.py", "tests/test_util.py", "tests/conftest.py", "pyproject.toml"],
    )
