"""``cadenza experiment ...``: reproducible studies built on the library."""

from __future__ import annotations

from pathlib import Path

import typer

from cadenza.errors import CadenzaError


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="Reproducible experiments (e.g. tool hints).", no_args_is_help=True)

    @group.command("tool-hints")
    def tool_hints(
        out: Path = typer.Option(
            ..., "--out", help="Output directory (results.json, summary.md, curves.png)."
        ),
        seeds: int = typer.Option(0, help="Number of seeds (0 = the default: 3, or 1 with --quick)."),
        quick: bool = typer.Option(False, help="One seed, fewer episodes: a smoke run in under 3 minutes."),
    ) -> None:
        """Does a tool-list hint at the faulty turn (self-distillation) beat GRPO alone? Four arms, fixed seeds."""
        if seeds < 0:
            raise CadenzaError("--seeds must be >= 1")
        from cadenza.experiments.tool_hints import ExperimentConfig, run_experiment

        exp = ExperimentConfig.quick() if quick else ExperimentConfig()
        if seeds:
            exp.seeds = list(range(seeds))
        run_experiment(out, exp, log=typer.echo)
        typer.echo(f"wrote {out / 'summary.md'}, {out / 'results.json'}, {out / 'curves.png'}")

    app.add_typer(group, name="experiment")
