"""Benchmark figures quoted in the docs, checked against ``bench/results/*.json``.

A quoted figure carries its source right after it, invisible once rendered::

    214<!-- bench rollout.json tokens_per_s.smollm2.vllm --> tok/s (1.70<!-- bench rollout.json
    steps_per_min.1/steps_per_min.0 -->x)

The key is a path of dict keys and list indices joined by ``.`` (a key that itself contains dots, such as
``pypi:cachetools==8.0.2``, is found whole); ``a/b`` quotes the ratio of two paths. The quoted number
must equal the JSON value rounded half-up to the decimals it shows.
"""

from __future__ import annotations

import json
import re
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

MARK = re.compile(r"(?P<num>-?\d+(?:\.\d+)?)<!-- bench (?P<file>[\w.-]+\.json) (?P<key>\S+) -->")
NUMBER = re.compile(r"(?<![\w.=~-])\d+(?:\.\d+)?(?![\w.]*\w)")


def lookup(data: Any, path: str) -> Any:
    """The value at a dotted ``path`` (the longest key that matches first, so dotted keys work)."""

    def walk(obj: Any, parts: list[str]) -> Any:
        if not parts:
            return obj
        for i in range(len(parts), 0, -1):
            key = ".".join(parts[:i])
            if isinstance(obj, dict) and key in obj:
                try:
                    return walk(obj[key], parts[i:])
                except KeyError:
                    continue
            if isinstance(obj, list) and i == 1 and key.isdigit() and int(key) < len(obj):
                return walk(obj[int(key)], parts[1:])
        raise KeyError(".".join(parts))

    return walk(data, path.split("."))


def value(results: Path, file: str, key: str) -> float:
    data = json.loads((results / file).read_text())
    parts = key.split("/")
    out = float(lookup(data, parts[0]))
    for p in parts[1:]:
        out /= float(lookup(data, p))
    return out


def matches(quoted: str, actual: float) -> bool:
    """``quoted`` is ``actual`` rounded half-up to the decimals ``quoted`` shows."""
    decimals = len(quoted.split(".")[1]) if "." in quoted else 0
    step = Decimal(1).scaleb(-decimals)
    return Decimal(repr(actual)).quantize(step, rounding=ROUND_HALF_UP) == Decimal(quoted)


def check(text: str, results: Path, where: str = "") -> list[str]:
    """One line per quoted figure that disagrees with its JSON (or names a file or key that is missing)."""
    bad = []
    for m in MARK.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        try:
            actual = value(results, m["file"], m["key"])
        except (OSError, KeyError, ValueError, TypeError, ZeroDivisionError) as exc:
            bad.append(f"{where}:{line}: {m['num']} names {m['file']} {m['key']}, which is missing ({exc!r})")
            continue
        if not matches(m["num"], actual):
            bad.append(f"{where}:{line}: quotes {m['num']}, {m['file']} {m['key']} is {actual:g}")
    return bad


def unmarked(text: str) -> list[str]:
    """Numbers in ``text`` that carry no source marker (markers themselves removed first)."""
    return NUMBER.findall(re.sub(r"<!--.*?-->", "", MARK.sub("", text), flags=re.S))
