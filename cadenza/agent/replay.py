"""Scripted agents: a JSONL file of tool calls replayed through a real episode.

One line per call: ``{"tool": "bash", "args": {"command": "ls"}}``. ``args`` is passed through as the
model would send it (a JSON string or a non-object reaches the tool's argument check, which answers
with an ``invalid_arguments`` observation). :func:`patch_actions` turns a unified diff (e.g. a task's
``gold.patch``) into ``create``/``str_replace`` calls, the sanity check that the gold solution passes.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

from cadenza.agent.env import ToolCall
from cadenza.agent.episode import Episode, EpisodeConfig
from cadenza.agent.outcome import Outcome
from cadenza.agent.trajectory import Trajectory
from cadenza.errors import CadenzaError


def load_actions(path: str | os.PathLike[str]) -> list[ToolCall]:
    path = Path(path)
    if not path.is_file():
        raise CadenzaError(
            f"actions file {path} does not exist; pass a JSONL file with one tool call per line"
        )
    calls: list[ToolCall] = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CadenzaError(
                f"{path} line {lineno} is not valid JSON ({exc.msg}); write one object per line"
            ) from None
        if not isinstance(obj, dict) or not isinstance(obj.get("tool"), str):
            raise CadenzaError(
                f'{path} line {lineno} needs a "tool" name: {{"tool": "bash", "args": {{...}}}}'
            )
        calls.append(ToolCall(name=obj["tool"], arguments=obj.get("args", {}), id=f"call_{len(calls)}"))
    return calls


def replay(
    task_dir: str | os.PathLike[str], calls: list[ToolCall], config: EpisodeConfig | None = None
) -> tuple[Outcome, Trajectory]:
    """Run ``calls`` in order (stopping when the episode ends), then grade and monitor once.

    Returns the episode's typed :class:`~cadenza.agent.outcome.Outcome` (the trajectory stores its
    ``to_dict()`` form)."""
    config = config or EpisodeConfig(max_turns=max(50, len(calls) + 1))
    episode = Episode(task_dir, config)
    try:
        episode.reset()
        for call in calls:
            if episode.step(call).done:
                break
        episode.finish()
    finally:
        episode.close()
    assert episode.trajectory is not None and episode.outcome is not None
    return episode.outcome, episode.trajectory


def summary(outcome: Outcome) -> dict[str, Any]:
    """The ``--json`` object of ``cadenza replay``."""
    return {
        "resolved": outcome.resolved,
        "reward": outcome.reward,
        "f2p": {"passed": outcome.f2p[0], "total": outcome.f2p[1]},
        "p2p": {"passed": outcome.p2p[0], "total": outcome.p2p[1]},
        "flags": [asdict(f) for f in outcome.flags],
        "turns": outcome.turns,
    }


_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@")


def patch_actions(patch: str) -> list[dict[str, Any]]:
    """``create``/``str_replace`` calls that apply a unified diff (new files created, hunks replaced)."""
    actions: list[dict[str, Any]] = []
    lines = patch.splitlines(keepends=True)
    i = 0
    old_path = new_path = None
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- "):
            old_path = _strip(line[4:])
        elif line.startswith("+++ "):
            new_path = _strip(line[4:])
        elif _HUNK.match(line) and new_path is not None:
            old_block, new_block = [], []
            i += 1
            while i < len(lines) and not lines[i].startswith(("@@", "--- ", "diff ")):
                text = lines[i]
                if text.startswith("\\"):  # "\ No newline at end of file"
                    target = new_block if new_block and lines[i - 1].startswith("+") else old_block
                    if target:
                        target[-1] = target[-1].rstrip("\n")
                elif text[:1] in (" ", "\n"):
                    old_block.append(text[1:] if text[:1] == " " else "\n")
                    new_block.append(text[1:] if text[:1] == " " else "\n")
                elif text[:1] == "-":
                    old_block.append(text[1:])
                elif text[:1] == "+":
                    new_block.append(text[1:])
                i += 1
            if old_path is None:
                actions.append({"tool": "create", "args": {"path": new_path, "content": "".join(new_block)}})
            else:
                actions.append(
                    {
                        "tool": "str_replace",
                        "args": {"path": new_path, "old": "".join(old_block), "new": "".join(new_block)},
                    }
                )
            continue
        i += 1
    return actions


def _strip(name: str) -> str | None:
    name = name.rstrip("\n").split("\t", 1)[0].strip()
    if name == "/dev/null":
        return None
    return name[2:] if name[:2] in ("a/", "b/") else name
