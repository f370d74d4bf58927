"""``cadenza train CONFIG.toml``: GRPO + per-turn self-distillation over a pluggable environment."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def train(
        config: Path = typer.Argument(..., help="TOML config (see docs/config-reference.md)."),
        steps: int = typer.Option(0, help="Override run.steps (0 = keep the config's)."),
        out_dir: str = typer.Option("", "--out-dir", help="Override run.out_dir."),
        resume: bool = typer.Option(
            True, help="Continue from the newest checkpoint in out_dir if there is one."
        ),
        engine: str = typer.Option("", "--engine", help="Override rollout.engine: hf or vllm."),
        max_staleness: int | None = typer.Option(
            None, "--max-staleness", help="Override rollout.max_staleness (steps rollouts may run ahead)."
        ),
        executor: str = typer.Option(
            "", "--executor", help="Override rollout.executor: local (this process) or ray (rollout actors)."
        ),
        ray_address: str = typer.Option(
            "",
            "--ray-address",
            help="Override rollout.ray_address (host:port or auto; default: private cluster).",
        ),
        workers: int = typer.Option(0, "--workers", help="Override rollout.workers (Ray rollout actors)."),
        model: str = typer.Option(
            "",
            "--model",
            help="Override model.path: an HF directory, or smollm2 (offline SmolLM2-135M-Instruct).",
        ),
    ) -> None:
        """Train a policy with GRPO plus self-distillation from text hints; metrics, checkpoints, exact
        resume."""
        from cadenza import preflight

        preflight.check_train_extra()  # the config holds torch-side sections ([parallel]), as pretrain's
        from cadenza.rl.config import load_config, machine_checks
        from cadenza.rl.rollout.envs import SANDBOXED_ENVS

        overrides: dict[str, object] = {}
        if steps:
            overrides["run.steps"] = steps
        if out_dir:
            overrides["run.out_dir"] = out_dir
        if engine:
            overrides["rollout.engine"] = engine
        if max_staleness is not None:
            overrides["rollout.max_staleness"] = max_staleness
        if model:
            overrides["model.path"] = model
        for key, value in (("executor", executor), ("ray_address", ray_address), ("workers", workers)):
            if value:
                overrides[f"rollout.{key}"] = value
        cfg = load_config(config, overrides)  # every config error surfaces here, before torch is imported
        preflight.for_launch(cfg, resume=resume)  # [parallel] vs world and model, the checkpoint's model
        preflight.for_train(Path(cfg.run.out_dir), sandboxed=cfg.env.name in SANDBOXED_ENVS)
        preflight.run_checks(machine_checks(cfg))  # what the config asks of the machine: vLLM, Ray, wandb

        from cadenza.rl.train.trainer import Trainer

        try:
            trainer = Trainer(cfg, resume=resume)  # under torchrun: this rank of the data-parallel group
            try:
                rows = trainer.train()
            except Exception as exc:
                _exit_if_rank_lost(cfg, exc)  # before the group's teardown, which a dead peer would stall
                raise
            finally:
                trainer.dp.leave()
        except Exception as exc:
            _exit_if_rank_lost(cfg, exc)
            raise
        if rows:
            last = rows[-1]
            typer.echo(
                f"done: step {last['step']}, reward {last['reward']:.3f}, invalid-tool rate "
                f"{last['invalid_tool_rate']:.3f}; metrics in {Path(cfg.run.out_dir) / 'metrics.jsonl'}"
            )
            if "units_retried" in last:  # rollout actors: the run's faults, as counted by the workers
                typer.echo(
                    f"rollout units: {last['units_retried']} retried after a worker died, "
                    f"{last['units_lost']} lost"
                )


def _exit_if_rank_lost(cfg: object, exc: Exception) -> None:
    """A collective failed (another rank died or hung past ``run.collective_timeout_s``): one line naming
    the likely cause and the newest checkpoint, then exit 1 at once (no teardown waiting on the dead)."""
    import os
    import sys

    from cadenza.parallel.launch import collective_failure, launched_ranks

    if launched_ranks() <= 1 or not collective_failure(exc):
        return
    from cadenza.rl.train.checkpoint import latest_checkpoint

    out = Path(cfg.run.out_dir)  # type: ignore[attr-defined]
    newest = latest_checkpoint(out)
    first = " ".join(str(exc).split())[:160]
    typer.echo(
        f"error: rank {os.environ.get('RANK', '?')}: a collective failed ({type(exc).__name__}: {first}); "
        f"another rank most likely died (see its output) or hung past run.collective_timeout_s = "
        f"{cfg.run.collective_timeout_s:g} s; newest checkpoint: "  # type: ignore[attr-defined]
        f"{newest if newest is not None else 'none'} (run the same command again to resume from it)",
        err=True,
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)
