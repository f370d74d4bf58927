"""The trainer's progress bar on rank 0 (rich)."""

from __future__ import annotations

from typing import Any


def progress_bar(total: int, done: int) -> tuple[Any, Any]:
    """A started rich progress bar and its task id."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    progress = Progress(
        TextColumn("[bold]train"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[info]}"),
        TimeRemainingColumn(),
        transient=False,
    )
    bar = progress.add_task("train", total=total, completed=done, info="")
    progress.start()
    return progress, bar
