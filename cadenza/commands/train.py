"""``cadenza train CONFIG.toml``: GRPO + per-turn self-distillation over a pluggable environment."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def train(
        config: Path = typer.Argument(..., help="TOML config (see README, section trainer)."),
        steps: int = typer.Option(0, help="Override run.steps (0 = keep the config's)."),
        out_dir: str = typer.Option("", "--out-dir", help="Override run.out_dir."),
        resume: bool = typer.Option(
            True, help="Continue from the newest checkpoint in out_dir if there is one."
        ),
        engine: str = typer.Option("", "--engine", help="Override rollout.engine: hf or vllm."),
        max_staleness: int | None = typer.Option(
            None, "--max-staleness", help="Override rollout.max_staleness (steps rollouts may run ahead)."
        ),
    ) -> None:
        """Train a policy with GRPO plus self-distillation from text hints; metrics, checkpoints, exact resume."""
        from cadenza.rl.config import load_config

        overrides: dict[str, object] = {}
        if steps:
            overrides["run.steps"] = steps
        if out_dir:
            overrides["run.out_dir"] = out_dir
        if engine:
            overrides["rollout.engine"] = engine
        if max_staleness is not None:
            overrides["rollout.max_staleness"] = max_staleness
        cfg = load_config(config, overrides)  # every config error surfaces here, before torch is imported

        from cadenza.rl.trainer import Trainer

        trainer = Trainer(cfg, resume=resume)
        rows = trainer.train()
        if rows:
            last = rows[-1]
            typer.echo(
                f"done: step {last['step']}, reward {last['reward']:.3f}, invalid-tool rate "
                f"{last['invalid_tool_rate']:.3f}; metrics in {Path(cfg.run.out_dir) / 'metrics.jsonl'}"
            )
