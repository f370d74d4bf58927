"""CLI options shared by several commands (one definition, the same flag everywhere)."""

from __future__ import annotations

from typing import Any

import typer


def executor_option(help: str, default: str = "local") -> Any:
    """``--executor local|ray``."""
    return typer.Option(default, "--executor", help=help)


def ray_address_option(default: str = "") -> Any:
    """``--ray-address``: a running cluster to join instead of a private loopback one."""
    return typer.Option(
        default,
        "--ray-address",
        help="With --executor ray: host:port or auto (default: a private local cluster).",
    )
