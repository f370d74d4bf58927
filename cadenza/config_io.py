"""Reading TOML config files strictly: one owner for ``cadenza train`` and ``cadenza pretrain``.

A config file's tables are the library's own ``@dataclass(kw_only=True)`` configs; :func:`from_dict`
builds them, and every mistake (unknown key with a did-you-mean, wrong type, missing required key,
invalid TOML, missing file) is a one-line :class:`ConfigError` naming the key and the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Literal

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


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``data`` with ``{"section.key": value}`` overrides (from command-line flags) written in place."""
    for dotted, value in overrides.items():
        section = data
        *heads, last = dotted.split(".")
        for h in heads:
            section = section.setdefault(h, {})
        section[last] = value
    return data


def type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    if origin in (types.UnionType, typing.Union):
        return " or ".join(type_name(a) for a in typing.get_args(tp))
    if origin is not None:
        return getattr(origin, "__name__", str(tp))
    return getattr(tp, "__name__", str(tp))


def _convert(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a table ([{where}]), got {type(value).__name__}")
        return from_dict(tp, value, where)
    if tp is Any:
        return value
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{where} = {value!r} is not allowed; use {type_name(tp)}")
        return value
    if origin in (types.UnionType, typing.Union):
        errors = []
        for arg in typing.get_args(tp):
            if arg is type(None):
                if value is None:
                    return None
                continue
            try:
                return _convert(value, arg, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(f"{where} = {value!r} has the wrong type; expected {type_name(tp)}")
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where} must be a list, got {type(value).__name__} {value!r}")
        (item,) = typing.get_args(tp) or (Any,)
        return [_convert(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a table, got {type(value).__name__}")
        return dict(value)
    if tp in _SCALARS:
        accepted, what = _SCALARS[tp]
        if not isinstance(value, accepted) or (tp is not bool and isinstance(value, bool)):
            raise ConfigError(f"{where} must be {what}, got {value!r}")
        return float(value) if tp is float else value
    raise AssertionError(f"unsupported config type {tp!r} at {where}")


# TOML scalar types: what a field of each accepts (never a bool for a number) and how an error names it.
_SCALARS: dict[Any, tuple[Any, str]] = {
    bool: (bool, "true or false"),
    int: (int, "an integer"),
    float: (int | float, "a number"),
    str: (str, "a string"),
}


def from_dict(cls: type, data: dict[str, Any], where: str = "") -> Any:
    """Build dataclass ``cls`` from ``data``, rejecting unknown keys and wrong types with the key's path."""
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in data.items():
        name = f"{where}.{key}" if where else key
        if key not in fields:
            close = difflib.get_close_matches(key, sorted(fields), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(sorted(fields))})"
            raise ConfigError(f"unknown config key {name!r}{hint}")
        kwargs[key] = _convert(value, hints[key], name)
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.init
        and f.name not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        table = f"[{where}]" if where else "the config"
        raise ConfigError(f"{table} is missing {', '.join(repr(m) for m in missing)}; add it to the file")
    return cls(**kwargs)
