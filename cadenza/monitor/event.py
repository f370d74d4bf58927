"""The monitor's vocabulary: a tool :class:`Call`, the :class:`Event` rules read, and shared helpers."""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any

from cadenza.agent.trajectory import Trajectory
from cadenza.monitor.pycode import PyFacts
from cadenza.monitor.shell import DYNAMIC

SHELLS = {"sh", "bash", "zsh", "dash", "ksh", "ash", "fish", "rbash"}
_PY = re.compile(r"^(python[0-9.]*|pypy[0-9.]*|ipython3?)$")
_OTHER_INTERP = {"perl", "ruby", "node", "nodejs", "php", "lua", "tclsh", "awk", "gawk", "R", "Rscript"}
_LISTERS = {"ls", "find", "tree", "du", "stat", "locate", "mlocate", "plocate", "dir", "realpath", "readlink"}
_DELETERS = {"rm", "unlink", "rmdir", "shred"}
_PATTERN_FIRST = {"grep", "egrep", "fgrep", "rg", "ag", "ack", "sed", "awk", "gawk", "git"}
_DECODE_RE = re.compile(
    r"\b(base64|base32|basenc|xxd|openssl|rev|tr|gunzip|zcat|uudecode)\b|b64decode|fromhex|decompress|rot.?13"
)
_EXCLUDES = {
    "-I",
    "--ignore",
    "--hide",
    "--exclude",
    "--exclude-dir",
    "--exclude-from",
    "--ignore-dir",
    "--skip",
}


@dataclass
class Call:
    """One tool call at one turn."""

    turn: int
    tool: str
    args: dict[str, Any]
    raw: str
    id: str = ""


@dataclass
class Event:
    """What a tool call did, as a detector sees it.

    ``kind``: ``exec`` (a command with ``argv``), ``path`` (``path`` used with ``op`` read/list/write/
    delete/exec), ``edit`` (``path`` written with ``old``→``new`` text when known), ``code`` (Python
    the agent ran, ``facts``), ``obfuscation`` (execution of something that could not be read).
    """

    kind: str
    turn: int
    tool: str
    raw: str
    argv: list[str] = field(default_factory=list)
    path: str = ""
    op: str = ""
    old: str | None = None
    new: str | None = None
    edit_kind: str = ""
    facts: PyFacts | None = None
    code: str = ""
    detail: str = ""


def tool_calls(traj: Trajectory) -> list[Call]:
    """Every tool call with its turn index, from the messages (all calls of a turn) or the turn metadata."""
    turn_of_message = {t.message_index: t.index for t in traj.turns}
    calls: list[Call] = []
    seen_turns: set[int] = set()
    assistant_count = 0
    for mi, msg in enumerate(traj.messages):
        if msg.get("role") != "assistant":
            continue
        turn = turn_of_message.get(mi, assistant_count)
        assistant_count += 1
        for tc in msg.get("tool_calls") or []:
            fn = tc.get("function") or {}
            args = fn.get("arguments", {})
            calls.append(
                Call(
                    turn=turn,
                    tool=str(fn.get("name", "")),
                    args=_args(args),
                    raw=_raw(args),
                    id=str(tc.get("id") or ""),
                )
            )
            seen_turns.add(turn)
    for t in traj.turns:
        if t.index not in seen_turns and t.tool:
            calls.append(
                Call(turn=t.index, tool=t.tool, args=_args(t.arguments or {}), raw=_raw(t.arguments or {}))
            )
    calls.sort(key=lambda c: c.turn)
    return calls


def _args(args: Any) -> dict[str, Any]:
    if isinstance(args, dict):
        return args
    if isinstance(args, str):
        try:
            val = json.loads(args)
            return val if isinstance(val, dict) else {"_raw": args}
        except json.JSONDecodeError:
            return {"_raw": args}
    return {}


def _raw(args: Any) -> str:
    return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


def _first(args: dict[str, Any], *names: str) -> Any:
    for n in names:
        if n in args and args[n] is not None:
            return args[n]
    return None


def norm(path: str) -> str:
    """A path with ``./`` and ``..`` folded, leading ``/workspace``-style prefixes kept."""
    if not path or DYNAMIC in path:
        return path
    return posixpath.normpath(path) if "/" in path or path.startswith(".") else path


def _selector(args: dict[str, Any]) -> list[str]:
    sel = _first(args, "selector", "path", "tests")
    return [sel] if isinstance(sel, str) and sel else []


def _find_exec(argv: list[str]) -> list[list[str]]:
    """Commands nested in ``find -exec``/``-execdir``/``-ok``."""
    if posixpath.basename(argv[0]) != "find":
        return []
    out, i = [], 0
    while i < len(argv):
        if argv[i] in ("-exec", "-execdir", "-ok", "-okdir"):
            j = i + 1
            while j < len(argv) and argv[j] not in (";", "+", "\\;"):
                j += 1
            out.append([a for a in argv[i + 1 : j] if a != "{}"] or ["true"])
            i = j
        i += 1
    return out


def _find_exec_rm(args: list[str]) -> bool:
    return any(
        args[i] in ("-exec", "-execdir")
        and i + 1 < len(args)
        and posixpath.basename(args[i + 1]) in _DELETERS
        for i in range(len(args))
    )


def _interp_code(argv: list[str]) -> str | None:
    for i, a in enumerate(argv[1:], 1):
        if a in ("-e", "-E", "--eval", "-r", "-c", "-p") and i + 1 < len(argv):
            return argv[i + 1]
    if posixpath.basename(argv[0]) in ("awk", "gawk"):  # the program is the first operand
        rest = [a for a in argv[1:] if not a.startswith("-")]
        return rest[0] if rest else None
    return None


_OTHER_SHELL = re.compile(
    r"""\b(?:system|exec|popen|execSync|spawnSync|shell_exec|passthru|qx)\s*\(?\s*(?P<q>['"])(?P<cmd>[^'"]{1,500})(?P=q)|`(?P<tick>[^`]{1,500})`"""
)
