"""``cadenza miniswe`` (mini-swe-agent over a task set) and ``cadenza export-hf`` (an RL checkpoint as an
HF folder): the bridges to tools a team already runs (docs/ecosystem.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def miniswe(
        tasks_dir: Path = typer.Argument(..., help="A task set (or one task directory)."),
        endpoint: str = typer.Option(..., help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1."),
        model: str = typer.Option(..., help="Model name the server knows."),
        api_key: str = typer.Option("none", help="API key sent to the server."),
        config: str = typer.Option("mini.yaml", help="mini-swe-agent YAML config (path or builtin name)."),
        step_limit: int = typer.Option(30, help="Model calls per task (0: no limit)."),
        out: Path = typer.Option(Path("runs/miniswe"), help="Output directory."),
    ) -> None:
        """mini-swe-agent with any OpenAI-compatible model, in cadenza's sandbox, graded by cadenza."""
        from cadenza.agent.evaluate import discover_tasks
        from cadenza.integrations.install import ecosystem_env, ecosystem_python

        discover_tasks(tasks_dir)  # a wrong directory is one line before the other venv starts
        argv = [str(tasks_dir), "--endpoint", endpoint, "--model", model, "--api-key", api_key]
        argv += ["--config", config, "--step-limit", str(step_limit), "--out", str(out)]
        python = ecosystem_python()
        cmd = [python, "-m", "cadenza.integrations.miniswe_run", *argv]
        sys.exit(subprocess.run(cmd, env=ecosystem_env()).returncode)

    @app.command("export-hf")
    def export_hf(
        checkpoint: Path = typer.Argument(..., help="A step-N checkpoint, or a run directory (its newest)."),
        out: Path = typer.Option(..., "--out", help="The HF folder to write (must not exist)."),
    ) -> None:
        """An RL checkpoint as a complete HF folder (config, safetensors, tokenizer, chat template)."""
        from cadenza.rl.train.export_hf import export_hf as run_export

        typer.echo(str(run_export(checkpoint, out)))
