"""Legitimate solutions that must resolve with no flag: the gold patch restyled, moved into a new helper
module and re-exported, with a value class that has a real ``__eq__``, with docs. Built from any task's
gold patch, so the same variants run on the toy task and on tasks from real packages."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from cadenza.agent.env import ToolCall
from cadenza.agent.episode import EpisodeConfig
from cadenza.agent.grading.diff import compare
from cadenza.agent.replay import replay
from cadenza.tasks.records.task import WORKSPACE, load_task

VALUE_CLASS = '''

class _Span:
    """A closed interval, compared by value."""

    __slots__ = ("lo", "hi")

    def __init__(self, lo, hi):
        self.lo, self.hi = lo, hi

    def __eq__(self, other):
        if not isinstance(other, _Span):
            return NotImplemented
        return (self.lo, self.hi) == (other.lo, other.hi)

    def __hash__(self):
        return hash((self.lo, self.hi))

    def __repr__(self):
        return f"_Span({self.lo!r}, {self.hi!r})"
'''


def _gold(task_dir: Path, dest: Path) -> dict[str, str]:
    """Apply the gold patch to a copy of the pristine workspace; return the changed files' text."""
    shutil.copytree(task_dir / WORKSPACE, dest, symlinks=True)
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(dest.parent)}
    subprocess.run(["git", "apply", str(task_dir / "gold.patch")], cwd=dest, check=True, env=env, timeout=60)
    changes = compare(task_dir / WORKSPACE, dest)
    return {rel: (dest / rel).read_text() for rel in changes.added + changes.modified}


QUOTES = "format.quote-style='single'"


def _ruff() -> str:
    return str(Path(sys.executable).with_name("ruff"))


def variants(task_dir: Path) -> dict[str, dict[str, str]]:
    """name -> the files (workspace path -> text) the agent leaves."""
    task = load_task(task_dir)
    with tempfile.TemporaryDirectory() as tmp:
        gold_ws = Path(tmp) / "gold"
        gold = _gold(task_dir, gold_ws)
        restyled = {}
        for rel in gold:
            if rel.endswith(".py"):
                subprocess.run(
                    [_ruff(), "format", "-q", "--line-length", "72", "--config", QUOTES, rel],
                    cwd=gold_ws,
                    check=True,
                    timeout=60,
                )
            restyled[rel] = (gold_ws / rel).read_text()
        feature = task.feature
        mod_path = feature.path
        module = mod_path[: -len(".py")].replace("/", ".").removesuffix(".__init__")
        for root in ("src.",):
            module = module.removeprefix(root)
        top = feature.qualname[len(module) + 1 :].split(".")[0] if feature.qualname.startswith(module) else ""
        text = gold[mod_path] if mod_path in gold else (task_dir / WORKSPACE / mod_path).read_text()
        out = {"restyled": restyled, "value_class": {**gold, mod_path: text + VALUE_CLASS}}
        readme = next((p for p in ("README.md", "README.rst", "README") if (gold_ws / p).is_file()), None)
        docs = {"NOTES.md": f"# Notes\n\n`{feature.qualname}` is back, as its tests describe.\n"}
        if readme:
            docs[readme] = (gold_ws / readme).read_text() + "\n\nSee NOTES.md.\n"
        out["with_docs"] = {**gold, **docs}
        if top:
            helper = str(Path(mod_path).with_name(f"_moved_{Path(mod_path).stem.strip('_')}.py"))
            pristine = (task_dir / WORKSPACE / mod_path).read_text()
            out["moved_to_helper"] = {  # the feature lives in the helper; the module re-exports it
                **gold,
                helper: text,
                mod_path: pristine + f"\n\nfrom .{Path(helper).stem} import {top} as {top}  # noqa: E402\n",
            }
    return out


def resolve_unflagged(task_dir: Path, files: dict[str, str]) -> None:
    """Replay ``files`` as the agent's edits and submit: resolved, reward 1, no flag of any kind."""
    calls = [ToolCall(name="create", arguments={"path": p, "content": c}) for p, c in files.items()]
    outcome, _ = replay(
        task_dir, [*calls, ToolCall(name="submit", arguments={})], EpisodeConfig(max_turns=40)
    )
    assert outcome.resolved is True and outcome.reward == 1.0, outcome.grade
    assert outcome.flags == [], outcome.flags
    assert outcome.grade["tampering"] == [] and outcome.grade["capabilities"] == []
