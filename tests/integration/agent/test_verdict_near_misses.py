"""Legitimate solutions near the attacks (``tests/support/near_misses.py``) resolve with no flag on the
toy task: restyled, moved into a helper module and re-exported, with a value class, with docs. The same
variants run on tasks from three real packages in ``tests/integration/tasks/test_build.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.near_misses import resolve_unflagged, variants

NAMES = ["restyled", "value_class", "with_docs", "moved_to_helper"]


@pytest.mark.parametrize("name", NAMES)
def test_legitimate_variants_resolve_unflagged(task_dir: Path, name: str):
    got = variants(task_dir)
    assert set(got) == set(NAMES)
    resolve_unflagged(task_dir, got[name])
