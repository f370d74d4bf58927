"""``cadenza experiment ...``: reproducible studies built on the library."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from cadenza.experiments.smol_tools import SmolConfig
    from cadenza.experiments.tool_hints import ExperimentConfig

OUT = typer.Option(
    ..., "--out", help="Output directory (results.json, summary.md, curves.png); rerun to resume."
)
WORKERS = typer.Option(1, help="Parallel processes for (arm, seed) runs (at most the cores).")


def _seeds(default: int) -> Any:
    return typer.Option(
        None,
        help=f"Seeds: a count ({default} = 0..{default - 1}), a list (0,3,4) or a range (2-4). "
        f"Default {default}, or 1 with --quick.",
    )


ALLOW_CODE_CHANGE = typer.Option(
    False,
    "--allow-code-change",
    help="Resume an --out another code commit started (recorded).",
)


def _run(
    run: Callable[..., Any],
    out: Path,
    exp: ExperimentConfig | SmolConfig,
    workers: int,
    quick: bool,
    allow_code_change: bool = False,
) -> None:
    """Check the worker count, run the study, name what it wrote."""
    from cadenza.experiments.study import check_workers

    check_workers(workers)
    if quick:
        typer.echo("--quick: a smoke test of the pipeline; its numbers say nothing about the arms")
    run(out, exp, workers=workers, log=typer.echo, allow_code_change=allow_code_change)
    typer.echo(f"wrote {out / 'summary.md'}, {out / 'results.json'}, {out / 'curves.png'}")


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="Reproducible experiments (e.g. tool hints).", no_args_is_help=True)

    @group.command("tool-hints")
    def tool_hints(
        out: Path = OUT,
        seeds: str | None = _seeds(5),
        arms: str = typer.Option("", help="Comma-separated arms (default: all; see docs/experiments.md)."),
        workers: int = WORKERS,
        budget_steps: int = typer.Option(
            0, "--budget-steps", help="RL steps per arm (0 = where the supervised control reaches 95%)."
        ),
        quick: bool = typer.Option(
            False,
            help="A smoke test (1 seed, 6 steps, tiny held-out set): checks the pipeline, not the arms.",
        ),
        study: int = typer.Option(
            1, help="1: the first study's arms and budget rule; 2: study 2 (its controls, fixed budget)."
        ),
        allow_code_change: bool = ALLOW_CODE_CHANGE,
        report_only: bool = typer.Option(
            False, "--report-only", help="Report what --out finished; name interrupted runs (no training)."
        ),
    ) -> None:
        """Does a hint at the faulty turn (self-distillation) beat GRPO? Pre-registered arms, fixed seeds."""
        from cadenza.errors import CadenzaError
        from cadenza.experiments.study import parse_arms, parse_seeds, run_experiment
        from cadenza.experiments.tool_hints import ExperimentConfig

        if study not in (1, 2):
            raise CadenzaError(f"--study {study}: use 1 or 2 (docs/experiments.md)")
        if study == 2:
            exp = ExperimentConfig.study2()
            if quick:  # the smoke test of study 2's pipeline: study 2's arms at --quick sizes
                exp = ExperimentConfig.quick()
                exp.arms, exp.control_stops_at_target = ExperimentConfig.study2().arms, False
        else:
            exp = ExperimentConfig.quick() if quick else ExperimentConfig()
        if seeds is not None:
            exp.seeds = parse_seeds(seeds)
        if arms:
            exp.arms = parse_arms(arms)
        if budget_steps < 0:
            raise CadenzaError("--budget-steps must be >= 0 (0 = from the supervised control)")
        if budget_steps or study == 1:
            exp.budget_steps = budget_steps
        if report_only:
            from cadenza.experiments.partial import report_only as report

            report(out, exp, log=typer.echo)
            typer.echo(f"wrote {out / 'summary.md'}, {out / 'results.json'}, {out / 'curves.png'}")
            return
        _run(run_experiment, out, exp, workers, quick, allow_code_change)

    @group.command("smol-tools")
    def smol_tools(
        out: Path = OUT,
        seeds: str | None = _seeds(2),
        arms: str = typer.Option(
            "",
            help="Arms among grpo, grpo_turn, grpo_sd, placebo (default: grpo, grpo_sd, placebo).",
        ),
        workers: int = WORKERS,
        steps: int = typer.Option(0, help="RL steps per (arm, seed) (0 = the pre-registered value)."),
        model: str = typer.Option(
            "smollm2", help="smollm2 (offline SmolLM2-135M-Instruct) or an HF directory."
        ),
        device: str = typer.Option("cpu", help="Torch device of the policy, e.g. cuda."),
        trainable_layers: int = typer.Option(
            -1, help="Last N decoder layers that train (0 = all; -1 = default)."
        ),
        quick: bool = typer.Option(
            False, help="A smoke test (1 seed, 1 step): checks the pipeline, not the arms."
        ),
        allow_code_change: bool = ALLOW_CODE_CHANGE,
    ) -> None:
        """Tool hints on a real pretrained model (SmolLM2): pre-RL gap, then GRPO vs GRPO+SD vs placebo."""
        from cadenza.errors import CadenzaError
        from cadenza.experiments.smol_tools import SmolConfig, check_arms, run_smol
        from cadenza.experiments.study import parse_seeds

        exp = SmolConfig.quick() if quick else SmolConfig()
        if seeds is not None:
            exp.seeds = parse_seeds(seeds)
        if arms:
            exp.arms = check_arms([a.strip() for a in arms.split(",")])
        if steps < 0 or trainable_layers < -1:
            raise CadenzaError("--steps must be >= 0 and --trainable-layers >= 0 (or -1 for the default)")
        exp.steps = steps or exp.steps
        exp.model, exp.device = model, device
        if trainable_layers >= 0:
            exp.trainable_layers = trainable_layers
        _run(run_smol, out, exp, workers, quick, allow_code_change)

    app.add_typer(group, name="experiment")
