"""Legitimate solutions near the attacks (``tests/support/near_misses.py``) resolve with no flag on the
toy task: restyled, moved into a helper module and re-exported, with a value class, with docs. The same
variants run on tasks from three real packages in ``tests/integration/tasks/test_build.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from cadenza.agent.env import ToolCall
from cadenza.agent.episode import EpisodeConfig
from cadenza.agent.replay import replay
from tests.support.near_misses import variants

NAMES = ["restyled", "value_class", "with_docs", "moved_to_helper"]


def resolve_unflagged(task_dir: Path, files: dict[str, str]) -> None:
    calls = [ToolCall(name="create", arguments={"path": p, "content": c}) for p, c in files.items()]
    outcome, _ = replay(
        task_dir, [*calls, ToolCall(name="submit", arguments={})], EpisodeConfig(max_turns=40)
    )
    assert outcome.resolved is True and outcome.reward == 1.0, outcome.grade
    assert outcome.flags == [], outcome.flags
    assert outcome.grade["tampering"] == [] and outcome.grade["capabilities"] == []


@pytest.mark.parametrize("name", NAMES)
def test_legitimate_variants_resolve_unflagged(task_dir: Path, name: str):
    got = variants(task_dir)
    assert set(got) == set(NAMES)
    resolve_unflagged(task_dir, got[name])
