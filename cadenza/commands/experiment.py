"""``cadenza experiment ...``: reproducible studies built on the library."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="Reproducible experiments (e.g. tool hints).", no_args_is_help=True)

    @group.command("tool-hints")
    def tool_hints(
        out: Path = typer.Option(
            ..., "--out", help="Output directory (results.json, summary.md, curves.png); rerun to resume."
        ),
        seeds: str | None = typer.Option(
            None,
            help="Seeds: a count (5 = 0..4), a list (0,3,4) or a range (2-4). Default 5, or 1 with --quick.",
        ),
        arms: str = typer.Option("", help="Comma-separated arms (default: all; see docs/experiments.md)."),
        workers: int = typer.Option(1, help="Parallel processes for (arm, seed) runs (at most the cores)."),
        budget_steps: int = typer.Option(
            0, "--budget-steps", help="RL steps per arm (0 = where the supervised control reaches 95%)."
        ),
        quick: bool = typer.Option(
            False,
            help="A smoke test (1 seed, 6 steps, tiny held-out set): checks the pipeline, not the arms.",
        ),
    ) -> None:
        """Does a hint at the faulty turn (self-distillation) beat GRPO? Pre-registered arms, fixed seeds."""
        from cadenza.errors import CadenzaError
        from cadenza.experiments.study import check_workers, parse_arms, parse_seeds, run_experiment
        from cadenza.experiments.tool_hints import ExperimentConfig

        exp = ExperimentConfig.quick() if quick else ExperimentConfig()
        if seeds is not None:
            exp.seeds = parse_seeds(seeds)
        if arms:
            exp.arms = parse_arms(arms)
        if budget_steps < 0:
            raise CadenzaError("--budget-steps must be >= 0 (0 = from the supervised control)")
        exp.budget_steps = budget_steps
        check_workers(workers)
        if quick:
            typer.echo("--quick: a smoke test of the pipeline; its numbers say nothing about the arms")
        run_experiment(out, exp, workers=workers, log=typer.echo)
        typer.echo(f"wrote {out / 'summary.md'}, {out / 'results.json'}, {out / 'curves.png'}")

    app.add_typer(group, name="experiment")
