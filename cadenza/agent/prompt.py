"""The initial messages of an episode: a system prompt that lists the tools, and the task statement."""

from __future__ import annotations

import json
from typing import Any

SYSTEM_TEMPLATE = """You are a software engineer working in a Python repository at {workspace}.
A feature of this repository is missing; implement it so the test suite passes.

Work only through the tools below. Commands run in a sandbox without network access; only the
repository is writable. Do not edit or add tests, test configuration or conftest.py files: grading
restores them and runs the original tests on your source changes. When you are done, call submit.

Tools (OpenAI function-calling schemas):
{tools}
"""


def initial_messages(*, workspace: str, statement: str, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    system = SYSTEM_TEMPLATE.format(workspace=workspace, tools=json.dumps(tools, indent=1))
    return [{"role": "system", "content": system}, {"role": "user", "content": statement}]
