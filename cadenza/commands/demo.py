"""``cadenza demo``: the main job on an embedded default (see README).

Today the demo is the task factory: it builds validated, leak-free tasks from a real PyPI package
and prints the summary table. :func:`cadenza.tasks.demo.build_demo_tasks` is the reusable step a
longer demo (tasks -> rollouts -> RL) calls first.
"""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def demo(
        out: Path = typer.Option(Path("runs/demo-tasks"), "--out", help="Task set directory (a rerun resumes it)."),
        source: str | None = typer.Option(None, "--source", help="Override the embedded default PyPI package."),
        max_tasks: int | None = typer.Option(None, "--max-tasks", help="Tasks to build (default 12)."),
    ) -> None:
        """Build validated feature-deletion tasks from a real PyPI package and print the summary."""
        from rich.console import Console

        from cadenza.tasks.demo import DEMO_MAX_TASKS, DEMO_SOURCE, build_demo_tasks
        from cadenza.tasks.report import out_console, print_summary

        console = out_console()
        summary = build_demo_tasks(out, source=source or DEMO_SOURCE, max_tasks=max_tasks or DEMO_MAX_TASKS,
                                   console=Console(stderr=True))
        print_summary(summary, console)
        n = len(summary.tasks)
        console.print(f"{n} validated task(s) in {summary.out}; try: cadenza tasks list {out}")
        if n == 0:
            raise typer.Exit(1)
