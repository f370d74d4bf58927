"""A small JSON-schema checker for tool arguments (the subset our tool schemas use).

The message names the first problem and shows the expected signature, so a model can fix its call.
"""

from __future__ import annotations

import json
from typing import Any

_TYPES = {"string": str, "integer": int, "object": dict, "boolean": bool}


def signature(parameters: dict[str, Any]) -> str:
    req = set(parameters.get("required", []))
    parts = [
        f'"{name}": {spec.get("type", "any")}{"" if name in req else " (optional)"}'
        for name, spec in parameters.get("properties", {}).items()
    ]
    return "{" + ", ".join(parts) + "}"


def check_arguments(parameters: dict[str, Any], arguments: Any) -> tuple[dict[str, Any] | None, str | None]:
    """Return (arguments as a dict, None) or (None, problem). ``arguments`` may be a JSON string."""
    if isinstance(arguments, str):
        text = arguments.strip() or "{}"
        try:
            arguments = json.loads(text)
        except json.JSONDecodeError as exc:
            return None, f"arguments are not valid JSON ({exc.msg} at position {exc.pos})"
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return None, f"arguments must be a JSON object, got {type(arguments).__name__}"
    props = parameters.get("properties", {})
    for name in parameters.get("required", []):
        if name not in arguments:
            return None, f"missing required argument '{name}'"
    for name, value in arguments.items():
        if name not in props:
            return None, f"unexpected argument '{name}'"
        want = props[name].get("type")
        py = _TYPES.get(want)
        if py is not None and (not isinstance(value, py) or (py is int and isinstance(value, bool))):
            return None, f"argument '{name}' must be {want}, got {_json_type(value)}"
    return arguments, None


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return {str: "string", int: "integer", float: "number", list: "array", dict: "object"}.get(
        type(value), type(value).__name__
    )
