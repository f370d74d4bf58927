"""Generate ``docs/config-reference.md`` from the config dataclasses themselves (``python -m
cadenza.docgen``).

A field's documentation is what its source says next to it: the comment on its line (or the comment lines
right above it), or a string literal right below it; a section's is its class docstring. Defaults and
types come from the dataclass, so the reference cannot drift from the code (``tests/unit/test_docs.py``
fails when the checked-in file is stale).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import sys
import textwrap
import tokenize
import typing
from pathlib import Path
from typing import Any

from cadenza.config_io import type_name

REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "config-reference.md"


def _roots() -> list[tuple[str, str, type]]:
    """(title, command, root config class) of every TOML config; imported here so the list stays short."""
    from cadenza.pretrain.config import PretrainConfig
    from cadenza.rl.config import TrainConfig

    return [
        ("`cadenza train CONFIG.toml`", "train", TrainConfig),
        ("`cadenza pretrain CONFIG.toml`", "pretrain", PretrainConfig),
    ]


def field_docs(cls: type) -> tuple[str, dict[str, str]]:
    """``cls``'s own docstring and ``{field: text}`` from the comments and string literals next to each
    field."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    classdef = ast.parse(source).body[0]
    assert isinstance(classdef, ast.ClassDef), cls
    body = classdef.body
    docs: dict[str, str] = {}
    for i, node in enumerate(body):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        parts = [comments[n] for n in range(node.lineno, node.end_lineno + 1) if n in comments]
        above, n = [], node.lineno - 1
        while n in comments and lines[n - 1].lstrip().startswith("#"):
            above.insert(0, comments[n])
            n -= 1
        nxt = body[i + 1] if i + 1 < len(body) else None
        if (
            isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            parts.append(inspect.cleandoc(nxt.value.value))
        docs[node.target.id] = " ".join(above + parts)
    return ast.get_docstring(classdef) or "", docs


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value: Any = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "**required**"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, dict) and not value:
        return "`{}`"
    return f"`{value!r}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def section(cls: type, name: str) -> list[str]:
    """Markdown for ``[name]`` (and, after it, each nested table such as ``[feedback.critic]``)."""
    hints = typing.get_type_hints(cls)
    intro, docs = field_docs(cls)
    for base in cls.__mro__[1:]:  # fields a section inherits (``[rollout]`` extends RolloutParams)
        if dataclasses.is_dataclass(base):
            docs = {**field_docs(base)[1], **docs}
    out = [f"### `[{name}]`", ""]
    if intro:
        out += [_cell(intro), ""]
    nested, rows = [], []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            nested.append((tp, f"{name}.{f.name}"))
            continue
        rows.append(
            f"| `{f.name}` | {_cell(type_name(tp))} | {_cell(_default(f))} | {_cell(docs.get(f.name, ''))} |"
        )
    if rows:
        out += ["| key | type | default | meaning |", "| --- | --- | --- | --- |", *rows, ""]
    for tp, sub in nested:
        out += section(tp, sub)
    return out


def render() -> str:
    out = [
        "# Config reference",
        "",
        "<!-- Generated from the config dataclasses by `make docs` (python -m cadenza.docgen). -->",
        "",
        "Each TOML table is the library's own `@dataclass(kw_only=True)` config, loaded by one strict loader",
        "(`cadenza.config_io.from_dict`): an unknown key (with a did-you-mean), a wrong type or a missing",
        "required key is a one-line error before any work. Relative paths resolve against the config file.",
        "",
    ]
    for title, _command, root in _roots():
        out += [f"## {title}", ""]
        hints = typing.get_type_hints(root)
        for f in dataclasses.fields(root):
            out += section(hints[f.name], f.name)
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write the reference; ``--check`` only reports (exit 1) when the checked-in file is stale."""
    args = sys.argv[1:] if argv is None else argv
    text = render()
    if "--check" in args:
        current = REFERENCE.read_text() if REFERENCE.is_file() else ""
        if current != text:
            print(f"{REFERENCE} is stale; run: python -m cadenza.docgen", file=sys.stderr)
            return 1
        return 0
    tmp = REFERENCE.with_suffix(".md.tmp")
    tmp.write_text(text)
    tmp.replace(REFERENCE)
    print(f"wrote {REFERENCE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
