"""Reading TOML config files with one-line errors (shared by ``cadenza train`` and ``cadenza pretrain``)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from cadenza.errors import ConfigError


def read_toml(path: str | Path) -> dict[str, Any]:
    """The parsed file; a missing file or invalid TOML is a :class:`ConfigError` naming the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} not found; pass the path of a TOML config")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
