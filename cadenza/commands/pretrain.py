"""``cadenza pretrain CONFIG.toml``: continued pretraining on the dual mesh (launch with torchrun)."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def pretrain(
        config: Path = typer.Argument(..., help="TOML config (see docs/config-reference.md)."),
    ) -> None:
        """Continued pretraining of an HF causal LM with dual-mesh FSDP2, EP and CP.

        Multi-process: torchrun --nproc-per-node N -m cadenza pretrain CONFIG.toml
        """
        import json
        import os

        from cadenza import preflight

        preflight.check_train_extra()  # the config holds torch-side sections (parallel dims, Muon)
        from cadenza.pretrain.config import load_config

        cfg = load_config(config)  # torch-free: a bad file is one line before torch is imported
        preflight.for_pretrain(Path(cfg.output.dir))
        from cadenza.pretrain.loop import run

        summary = run(cfg)
        if int(os.environ.get("RANK", "0")) == 0:
            typer.echo(json.dumps(summary))
