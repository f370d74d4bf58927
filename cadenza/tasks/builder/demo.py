"""The task part of ``cadenza demo``: a small, real task set from an embedded default package.

cachetools: a pure-Python library whose test suite runs in about a second and covers most of its
methods, so level-1..3 candidates validate often and a dozen tasks build in a few minutes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cadenza.tasks.builder.factory import BuildConfig, BuildSummary, build_tasks

DEMO_SOURCE = "pypi:cachetools==8.0.2"
DEMO_MAX_TASKS = 12


def build_demo_tasks(
    out: Path,
    *,
    source: str = DEMO_SOURCE,
    max_tasks: int = DEMO_MAX_TASKS,
    levels: tuple[int, ...] = (1, 2, 3),
    seed: int = 0,
    progress: bool = True,
    console: Any = None,
) -> BuildSummary:
    """Build (or resume) the demo task set in ``out`` and return its summary."""
    cfg = BuildConfig(
        out=Path(out), workers=1, max_tasks=max_tasks, levels=levels, seed=seed, progress=progress
    )
    return build_tasks([source], cfg, console=console)
