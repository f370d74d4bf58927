"""The ``cadenza`` command line: parses arguments and calls library functions, nothing more.

Each command group lives in ``cadenza/commands/<group>.py`` and registers itself with
``register(app)``; heavy imports (torch, transformers) happen inside command bodies so that
``cadenza --help`` and the task commands start fast.
"""

from __future__ import annotations

import importlib
import sys

import typer

from cadenza.errors import CadenzaError

app = typer.Typer(
    name="cadenza",
    help="Training stack for coding agents: tasks, sandbox, RL with text feedback, Muon, dual-mesh HSDP.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Training stack for coding agents: tasks, sandbox, RL with text feedback, Muon, dual-mesh HSDP."""


# Command modules, in the order their commands appear in --help.
_COMMAND_MODULES = ("demo", "tasks", "replay", "eval", "train", "pretrain", "experiment", "ecosystem")


def _register_all() -> None:
    for name in _COMMAND_MODULES:
        importlib.import_module(f"cadenza.commands.{name}").register(app)


_register_all()


def main() -> None:
    """Entry point: user errors become one line on stderr and exit code 2."""
    try:
        app()
    except CadenzaError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
