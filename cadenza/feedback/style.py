"""Style feedback: ruff violations that an edit *introduced* (present after, absent before).

An edit turn records the file it changed in ``TurnMeta.extra``:
``{"path": "pkg/mod.py", "content_before": "...", "content_after": "..."}`` (``content_before`` is
``""`` for a new file). Real ``ruff check`` runs on both versions through stdin; a violation is new
when its (rule, source line text) pair occurs more often after than before, so edits that only shift
line numbers introduce nothing. The hint targets the edit turn itself.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass

from cadenza.agent.trajectory import Trajectory, TurnMeta
from cadenza.errors import CadenzaError
from cadenza.feedback.hints import Hint

DEFAULT_SELECT = ("E", "F", "W", "B")


@dataclass(frozen=True, kw_only=True)
class Violation:
    code: str
    line: int
    message: str
    source: str  # the text of the offending line, stripped


def ruff_command() -> list[str]:
    """``ruff`` from this interpreter's environment, else from PATH; a clear error when neither exists."""
    try:
        from ruff.__main__ import find_ruff_bin  # type: ignore[import-not-found]

        return [str(find_ruff_bin())]
    except (ImportError, FileNotFoundError):
        pass
    exe = shutil.which("ruff")
    if exe:
        return [exe]
    raise CadenzaError(f"style feedback needs ruff: run `{sys.executable} -m pip install ruff` or disable it")


def ruff_violations(content: str, filename: str, select: tuple[str, ...] = DEFAULT_SELECT) -> list[Violation]:
    """Run real ruff on ``content`` (as ``filename``, isolated from any project config)."""
    if not content.strip():
        return []
    cmd = [*ruff_command(), "check", "--isolated", "--no-cache", "--output-format", "json", "--exit-zero"]
    if select:
        cmd += ["--select", ",".join(select)]
    cmd += ["--stdin-filename", filename, "-"]
    proc = subprocess.run(cmd, input=content, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise CadenzaError(f"ruff failed on {filename}: {proc.stderr.strip().splitlines()[-1:]}")
    lines = content.splitlines()
    out = []
    for d in json.loads(proc.stdout or "[]"):
        row = d["location"]["row"]
        src = lines[row - 1].strip() if 0 < row <= len(lines) else ""
        out.append(Violation(code=d["code"] or "syntax", line=row, message=d["message"], source=src))
    return out


def new_violations(
    before: str, after: str, filename: str, select: tuple[str, ...] = DEFAULT_SELECT
) -> list[Violation]:
    """Violations in ``after`` not accounted for by ``before`` (multiset over (code, line text))."""
    old = Counter((v.code, v.source) for v in ruff_violations(before, filename, select))
    new = []
    for v in ruff_violations(after, filename, select):
        key = (v.code, v.source)
        if old[key] > 0:
            old[key] -= 1
        else:
            new.append(v)
    return new


def _edit_of(turn: TurnMeta) -> tuple[str, str, str] | None:
    extra = turn.extra or {}
    path, after = extra.get("path"), extra.get("content_after")
    if not isinstance(path, str) or not isinstance(after, str) or not path.endswith((".py", ".pyi")):
        return None
    return path, str(extra.get("content_before") or ""), after


def style(traj: Trajectory, select: tuple[str, ...] = DEFAULT_SELECT, max_items: int = 5) -> list[Hint]:
    """One hint per edit turn that introduced ruff violations: rule codes, lines and messages."""
    hints = []
    for t in traj.turns:
        edit = _edit_of(t)
        if edit is None or t.error_kind is not None:
            continue
        path, before, after = edit
        found = new_violations(before, after, path, select)
        if not found:
            continue
        items = "; ".join(f"{v.code} line {v.line} ({v.message})" for v in found[:max_items])
        more = f"; and {len(found) - max_items} more" if len(found) > max_items else ""
        text = f"Style: keep {path} clean under ruff; this edit would introduce {items}{more}."
        hints.append(Hint(turn=t.index, text=text, kind="style"))
    return hints
