"""``cadenza demo``: the main job on an embedded default (see README)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def demo() -> None:
        """Run the main job on the embedded default."""
        typer.echo("cadenza demo: nothing wired yet")
