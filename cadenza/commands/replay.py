"""``cadenza replay TASK_DIR ACTIONS.jsonl``: run a scripted agent, grade, monitor, print the outcome."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def replay(
        task_dir: Path = typer.Argument(..., help="A task directory (task.json, workspace/, gold.patch)."),
        actions: Path = typer.Argument(
            ..., help='JSONL, one tool call per line: {"tool": "...", "args": {...}}.'
        ),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object with the outcome."),
        no_sandbox: bool = typer.Option(
            False, "--no-sandbox", help="Run without bubblewrap (trusted debugging only)."
        ),
        save: Path | None = typer.Option(None, "--save", help="Write the trajectory JSON to this file."),
    ) -> None:
        """Replay scripted tool calls on a task, then grade and monitor the result."""
        from cadenza.agent.episode import EpisodeConfig
        from cadenza.agent.replay import load_actions, summary
        from cadenza.agent.replay import replay as run_replay
        from cadenza.sandbox import SandboxConfig
        from cadenza.tasks.records.task import load_task

        load_task(task_dir)  # a clear error for a wrong directory before anything runs
        calls = load_actions(actions)
        config = EpisodeConfig(
            max_turns=max(50, len(calls) + 1), sandbox=SandboxConfig(no_sandbox=no_sandbox)
        )
        outcome, trajectory = run_replay(task_dir, calls, config)
        if save is not None:
            trajectory.save(save)
        if as_json:
            typer.echo(json.dumps(summary(outcome)))
            return
        _print_outcome(outcome, sandboxed=trajectory.sandboxed)


def _print_outcome(outcome, *, sandboxed: bool) -> None:  # type: ignore[no-untyped-def]
    """The table for an :class:`~cadenza.agent.outcome.Outcome`."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="replay outcome", show_header=False)
    table.add_row("resolved", "[green]yes[/]" if outcome.resolved else "[red]no[/]")
    table.add_row("reward", f"{outcome.reward:g}")
    for key, (passed, total) in (("f2p", outcome.f2p), ("p2p", outcome.p2p)):
        table.add_row(key.upper(), f"{passed}/{total}")
    table.add_row("turns", str(outcome.turns))
    table.add_row("sandboxed", "yes" if sandboxed else "[yellow]no (--no-sandbox)[/]")
    dropped = outcome.grade.get("dropped", {})
    table.add_row("ignored changes", "\n".join(f"{p}: {r}" for p, r in dropped.items()) or "none")
    table.add_row(
        "flags", "\n".join(f"turn {f.turn} {f.rule}: {f.evidence}" for f in outcome.flags) or "none"
    )
    Console().print(table)
