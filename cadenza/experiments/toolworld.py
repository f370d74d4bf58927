"""toolworld: a toy multi-turn tool-use environment where the same operations go by different names.

Each episode belongs to a workspace *profile*; profiles name the same operations with different tool
names (``view`` / ``read_file`` / ``cat_file``). The prompt states the profile but not its tool list,
so a policy that has not learnt the profile's names must guess among aliases. Calling a tool the
profile lacks returns the standard tool-not-found observation with ``error_kind="tool_not_found"``.
The reward is 1 only if every operation of the episode completes. A successful call is answered
with the next pending operation (``ok. Next: delete log.``), so a tiny model need not count steps;
the tool names are never revealed.

Nothing here imports torch: the environment satisfies :class:`cadenza.agent.env.Env` and is driven by
``cadenza.rl`` rollouts like the real agent episode.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from cadenza.agent.env import StepResult, ToolCall
from cadenza.errors import ConfigError

# operation -> (description, {profile -> tool name})
OPERATIONS: dict[str, str] = {
    "read": "Show the contents of a file.",
    "write": "Write (create or overwrite) a file.",
    "list": "List the entries of a directory.",
    "delete": "Delete a file.",
}

PROFILES: dict[str, dict[str, str]] = {
    "alpha": {"read": "view", "write": "create", "list": "ls", "delete": "rm"},
    "beta": {"read": "read_file", "write": "write_file", "list": "list_dir", "delete": "delete_file"},
    "gamma": {"read": "cat_file", "write": "put_file", "list": "show_dir", "delete": "remove_file"},
}

FILES = ("notes", "main", "data", "readme", "config", "app", "todo", "log")
DIRS = ("src", "tests", "docs", "build")

SYSTEM_PROMPT = "Use one tool call per turn."

# ``tools_prompt = "system"``: the schemas in the system message, in the function-calling prompt format of
# the SmolLM2 instruct models (a <tools> JSON list; calls as a JSON list inside <tool_call> tags)
CALL_OPEN = '<tool_call>[{"name": "'  # what a call starts with (rollout.response_prefix forces it)
TOOLS_SYSTEM_PROMPT = (
    "You have access to the following tools:\n<tools>{tools}</tools>\n\n"
    "Answer with one tool call in this format and no other text:\n"
    '<tool_call>[{{"name": "tool_name", "arguments": {{"argument": "value"}}}}]</tool_call>'
)


def call_text(name: str, arguments: dict[str, Any]) -> str:
    """A call as the model writes it under ``tools_prompt = "system"``."""
    return f'{CALL_OPEN}{name}", "arguments": {json.dumps(arguments)}}}]</tool_call>'


def tool_not_found_observation(name: str) -> str:
    """The standard observation for a call to a tool that does not exist (the tool list is not revealed)."""
    return f"Error: tool '{name}' not found."


def tool_schema(name: str, operation: str) -> dict[str, Any]:
    arg_desc = "directory" if operation == "list" else "file"
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": OPERATIONS[operation],
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "description": f"The {arg_desc} path."}},
                "required": ["path"],
            },
        },
    }


@dataclass(frozen=True, kw_only=True)
class Step:
    operation: str
    path: str


@dataclass(frozen=True, kw_only=True)
class ToolworldTask:
    """One episode's specification: its profile and the operations to perform, in order."""

    id: str
    profile: str
    steps: tuple[Step, ...]

    def prompt(self) -> str:
        parts = [f"{s.operation} {s.path}" for s in self.steps]
        return f"Profile: {self.profile}.\nTask: " + ", ".join(parts) + "."


@dataclass(kw_only=True)
class ToolworldConfig:
    """Environment knobs; fixed before any experiment is run (see README, Honesty)."""

    profiles: list[str] = field(default_factory=lambda: list(PROFILES))
    min_steps: int = 2
    max_steps: int = 4
    extra_turns: int = 2  # turns allowed beyond the number of steps before the episode is cut off
    # "none": the tool list is not shown (the toy setting: the policy must know or be told the names);
    # "system": the profile's schemas go into the system message (TOOLS_SYSTEM_PROMPT), for a pretrained
    # model whose chat template renders no tools (SmolLM2)
    tools_prompt: str = "none"

    def validate(self) -> None:
        unknown = [p for p in self.profiles if p not in PROFILES]
        if unknown or not self.profiles:
            raise ConfigError(f"toolworld: unknown profiles {unknown}; known: {sorted(PROFILES)}")
        if not 1 <= self.min_steps <= self.max_steps:
            raise ConfigError("toolworld: need 1 <= min_steps <= max_steps")
        if self.extra_turns < 0:
            raise ConfigError("toolworld: extra_turns must be >= 0")
        if self.tools_prompt not in ("none", "system"):
            raise ConfigError(f"toolworld: tools_prompt {self.tools_prompt!r} is not 'none' or 'system'")


def sample_task(rng: random.Random, config: ToolworldConfig, index: int = 0) -> ToolworldTask:
    profile = rng.choice(config.profiles)
    n = rng.randint(config.min_steps, config.max_steps)
    steps = []
    for _ in range(n):
        op = rng.choice(list(OPERATIONS))
        path = rng.choice(DIRS if op == "list" else FILES)
        steps.append(Step(operation=op, path=path))
    return ToolworldTask(id=f"toolworld-{index}", profile=profile, steps=tuple(steps))


def parse_arguments(arguments: dict[str, Any] | str) -> dict[str, Any] | None:
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments)
    except (TypeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


class ToolworldEnv:
    """One episode of toolworld; satisfies :class:`cadenza.agent.env.Env`.

    ``show_tools = False``: the rollout must not render this episode's tool list into the prompt
    (the whole point is that the policy has to know or be told the names).
    """

    show_tools = False

    def __init__(self, task: ToolworldTask, config: ToolworldConfig | None = None):
        self.task = task
        self.config = config or ToolworldConfig()
        self._by_name = {name: op for op, name in PROFILES[task.profile].items()}
        self.reset()

    def reset(self) -> list[dict[str, Any]]:
        self._remaining = list(self.task.steps)
        self._turns = 0
        self.pending: list[Step | None] = []  # per call: the next pending operation when it was made
        self.calls = 0
        self.invalid_calls = 0
        system = SYSTEM_PROMPT
        if self.config.tools_prompt == "system":
            system = TOOLS_SYSTEM_PROMPT.format(tools=json.dumps([t["function"] for t in self.tools()]))
        return [
            {"role": "system", "content": system},
            {"role": "user", "content": self.task.prompt()},
        ]

    def correct_call(self, step: Step) -> tuple[str, dict[str, str]]:
        """The valid call that performs ``step`` in this episode's profile (the supervised control's
        target)."""
        return PROFILES[self.task.profile][step.operation], {"path": step.path}

    def tools(self) -> list[dict[str, Any]]:
        return [tool_schema(PROFILES[self.task.profile][op], op) for op in OPERATIONS]

    @property
    def max_turns(self) -> int:
        return len(self.task.steps) + self.config.extra_turns

    def step(self, call: ToolCall) -> StepResult:
        self._turns += 1
        self.calls += 1
        self.pending.append(self._remaining[0] if self._remaining else None)
        result = self._execute(call)
        if result.error_kind == "tool_not_found":
            self.invalid_calls += 1
        result.done = not self._remaining or self._turns >= self.max_turns
        return result

    def _execute(self, call: ToolCall) -> StepResult:
        op = self._by_name.get(call.name)
        if op is None:
            return StepResult(
                observation=tool_not_found_observation(call.name), done=False, error_kind="tool_not_found"
            )
        args = parse_arguments(call.arguments)
        path = args.get("path") if args is not None else None
        if args is None or not isinstance(path, str) or set(args) != {"path"}:
            return StepResult(
                observation=f"Error: {call.name} takes exactly one argument, 'path' (a string).",
                done=False,
                error_kind="invalid_arguments",
            )
        wanted = Step(operation=op, path=path)
        if wanted in self._remaining:
            self._remaining.remove(wanted)
        if not self._remaining:
            return StepResult(observation="ok. All done.", done=False, info={"operation": op})
        nxt = self._remaining[0]
        return StepResult(
            observation=f"ok. Next: {nxt.operation} {nxt.path}.", done=False, info={"operation": op}
        )

    def finish(self) -> dict[str, Any]:
        resolved = not self._remaining
        return {
            "reward": 1.0 if resolved else 0.0,
            "resolved": resolved,
            "calls": self.calls,
            "invalid_tool_calls": self.invalid_calls,
            "remaining_steps": len(self._remaining),
        }


@dataclass(kw_only=True)
class ToolworldSource:
    """Task source for the trainer: deterministic task sampling plus one env per (task, sample)."""

    config: ToolworldConfig = field(default_factory=ToolworldConfig)

    def __post_init__(self) -> None:
        self.config.validate()

    def sample_tasks(self, rng: random.Random, n: int, start_index: int = 0) -> list[ToolworldTask]:
        return [sample_task(rng, self.config, start_index + i) for i in range(n)]

    def make_env(self, task: ToolworldTask) -> ToolworldEnv:
        return ToolworldEnv(task, self.config)

    def probe_items(self, n: int, seed: int = 0) -> list[Any]:
        """A fixed held-out probe set for the hint-following diagnostic (:mod:`cadenza.rl.learn.probe`): the
        first turn of ``n`` tasks drawn from their own seed space, the ``tool_not_found`` hint (the tool list)
        and the correct first call."""
        from cadenza.experiments.corpus import call_message, tool_list_hint
        from cadenza.rl.learn.probe import ProbeItem

        rng = random.Random(f"toolworld-probe-{seed}")
        items = []
        for i in range(n):
            env = ToolworldEnv(sample_task(rng, self.config, i), self.config)
            first = env.task.steps[0]
            name = PROFILES[env.task.profile][first.operation]
            target = call_message(name, first.path, 0)
            if self.config.tools_prompt == "system":  # the call as the text the model writes
                target = {"role": "assistant", "content": call_text(name, {"path": first.path})}
            items.append(ProbeItem(messages=env.reset(), hint=tool_list_hint(env), target=target))
        return items


def make_source(options: dict[str, Any]) -> ToolworldSource:
    """Factory used by the trainer's env registry (``[env] name = "toolworld"``)."""
    known = set(ToolworldConfig.__dataclass_fields__)
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(f"[env.options] unknown toolworld option(s) {unknown}; known: {sorted(known)}")
    return ToolworldSource(config=ToolworldConfig(**options))
