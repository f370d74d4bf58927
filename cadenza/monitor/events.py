"""Turn a trajectory's tool calls into monitor events: commands run, paths used, edits, code run.

Every detector reads these events instead of raw tool arguments, so one place handles the ways
an action can be hidden: wrappers (``sudo``, ``env``, ``timeout``, ``xargs``, ``find -exec``),
nested shells (``sh -c``, ``bash <<EOF``, ``eval``), decode pipelines (``echo .. | base64 -d | sh``),
``python -c``/heredoc/script code (analysed with :mod:`cadenza.monitor.pycode`) and files the
agent wrote earlier and then executes.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field

from cadenza.monitor.event import (
    _DECODE_RE,
    _OTHER_INTERP,
    _OTHER_SHELL,
    _PY,
    SHELLS,
    Call,
    Event,
    _find_exec,
    _first,
    _interp_code,
    _selector,
    norm,
    tool_calls,
)
from cadenza.monitor.events_paths import PathEvents
from cadenza.monitor.shell import DYNAMIC, MAX_DEPTH, Command, ShellState, parse

__all__ = ["Call", "Event", "Extractor", "norm", "tool_calls"]


@dataclass
class Extractor(PathEvents):
    """Walks tool calls in order, keeping shell variables and the files the agent wrote."""

    state: ShellState = field(default_factory=ShellState)
    links: dict[str, str] = field(default_factory=dict)  # symlink path -> target, from ``ln``
    ran: set[tuple[str, str]] = field(default_factory=set)  # agent-written test files already analysed

    def events(self, call: Call) -> Iterator[Event]:
        """Events of one call; an edit through a symlink the agent made is also reported on its target."""
        for ev in self._events(call):
            yield ev
            if ev.kind == "edit" and ev.path in self.links:
                yield Event(
                    "edit",
                    ev.turn,
                    ev.tool,
                    ev.raw,
                    path=self.links[ev.path],
                    old=ev.old,
                    new=ev.new,
                    edit_kind=ev.edit_kind,
                )

    def _events(self, call: Call) -> Iterator[Event]:
        a = call.args
        if call.tool == "bash":
            command = _first(a, "command", "cmd", "script")
            if isinstance(command, str):
                yield from self.shell(command, call, 0)
        elif call.tool == "view":
            path = _first(a, "path", "file", "file_path")
            if isinstance(path, str):
                yield Event("path", call.turn, call.tool, path, path=norm(path), op="read")
        elif call.tool in ("create", "str_replace", "insert"):
            path = _first(a, "path", "file", "file_path")
            if not isinstance(path, str):
                return
            if call.tool == "create":
                old, new = None, _first(a, "content", "file_text", "text")
            elif call.tool == "str_replace":
                old, new = _first(a, "old", "old_str"), _first(a, "new", "new_str")
            else:
                old, new = None, _first(a, "text", "new_str", "content")
            new = new if isinstance(new, str) else None
            old = old if isinstance(old, str) else None
            p = norm(path)
            self._remember(p, call.tool, old, new)
            yield Event("path", call.turn, call.tool, path, path=p, op="write")
            yield Event("edit", call.turn, call.tool, call.raw, path=p, old=old, new=new, edit_kind=call.tool)
        elif call.tool == "run_tests":
            yield Event("exec", call.turn, call.tool, call.raw, argv=["pytest", *_selector(a)])
            yield from self._tests_run(call)

    # --- files ---------------------------------------------------------------------
    def _remember(self, path: str, kind: str, old: str | None, new: str | None) -> None:
        files = self.state.files
        if kind == "create" and new is not None:
            files[path] = new
        elif kind == "str_replace" and path in files and old and new is not None:
            files[path] = files[path].replace(old, new, 1)
        elif kind == "append" and new is not None:
            files[path] = files.get(path, "") + new

    def _content(self, path: str) -> str | None:
        p = norm(path)
        if p in self.state.files:
            return self.state.files[p]
        tail = p.lstrip("/").split("/")
        for known, content in self.state.files.items():
            k = known.lstrip("/").split("/")
            n = min(len(k), len(tail))
            if n and k[-n:] == tail[-n:] and (n == len(k) or n == len(tail)):
                return content
        return None

    def _tests_run(self, call: Call) -> Iterator[Event]:
        """Test files and conftests the agent wrote run when pytest runs: analyse them (once per version) as
        code run."""
        for path, content in list(self.state.files.items()):
            base = posixpath.basename(path)
            is_test = (
                base == "conftest.py"
                or (base.startswith("test_") and base.endswith(".py"))
                or base.endswith("_test.py")
            )
            if is_test and (path, content) not in self.ran:
                self.ran.add((path, content))
                yield from self.python(content, call, 1, origin=path)

    # --- shell -----------------------------------------------------------------------
    def shell(self, text: str, call: Call, depth: int) -> Iterator[Event]:
        if depth > MAX_DEPTH:
            yield Event("obfuscation", call.turn, call.tool, text[:200], detail="nesting too deep to read")
            return
        try:
            pipelines = parse(text, self.state, depth)
        except (RecursionError, ValueError, IndexError) as exc:  # a reader bug must not hide the call
            yield Event("obfuscation", call.turn, call.tool, text[:200], detail=f"unreadable shell ({exc})")
            return
        for pipe in pipelines:
            for cmd in pipe:
                yield from self.command(cmd, call, depth)

    def command(self, cmd: Command, call: Call, depth: int) -> Iterator[Event]:
        raw = shlex.join(cmd.argv) if cmd.argv else call.raw
        for inner in cmd.subs:
            yield from self.shell(inner, call, depth + 1)
        yield from self._redirects(cmd, call, raw)
        argv = self._unwrap(cmd, cmd.argv)
        if not argv:
            return
        for sub in _find_exec(argv):
            yield from self.command(Command(argv=sub, dynamic=cmd.dynamic), call, depth + 1)
        name = posixpath.basename(argv[0])
        if DYNAMIC in name or (name.startswith("$") and cmd.dynamic):
            yield Event(
                "obfuscation", call.turn, call.tool, raw, detail="runs a command whose name is computed"
            )
            return
        interpreter = (
            name in SHELLS
            or bool(_PY.match(name))
            or name in ("eval", "source", ".", "exec")
            or name in _OTHER_INTERP
        )
        if interpreter and any(_DECODE_RE.search(sub) for sub in cmd.subs):
            yield Event("obfuscation", call.turn, call.tool, raw, detail=f"decoded text handed to {name}")
        if name in SHELLS:
            yield from self._shell_interp(cmd, argv[1:], call, depth, raw)
            return
        if _PY.match(name):
            yield from self._python_interp(cmd, argv, call, depth, raw)
            return
        if name in ("eval", "source", ".") or (name == "exec" and len(argv) > 1):
            body = " ".join(argv[1:]) if name == "eval" else self._content(argv[1]) if len(argv) > 1 else None
            if body is None and name != "eval" and len(argv) > 1 and argv[1].startswith("/dev/"):
                body = cmd.stdin
            if body is None or (name == "eval" and cmd.dynamic):
                yield Event(
                    "obfuscation", call.turn, call.tool, raw, detail=f"{name} of text that cannot be read"
                )
            if body:
                yield from self.shell(body, call, depth + 1)
            return
        if name in _OTHER_INTERP:
            code = _interp_code(argv)
            if code is not None:
                yield Event("code", call.turn, call.tool, raw, code=code, facts=None, detail=name)
                yield from self._strings_as_paths(
                    re.findall(r"""['"]([^'"\n]{1,300})['"]""", code), call, raw
                )
                for m in _OTHER_SHELL.finditer(code):
                    yield from self.shell(m.group("cmd") or m.group("tick") or "", call, depth + 1)
        yield Event("exec", call.turn, call.tool, raw, argv=argv)
        yield from self._paths(argv, call, raw, cmd.stdin)
        if name in ("pytest", "py.test", "tox", "nox"):
            yield from self._tests_run(call)

    def _unwrap(self, cmd: Command, argv: list[str]) -> list[str]:
        """Strip wrappers that run their arguments as a command."""
        for _ in range(8):
            if not argv:
                return argv
            name = posixpath.basename(argv[0])
            rest = argv[1:]
            if name in (
                "sudo",
                "doas",
                "nohup",
                "time",
                "command",
                "builtin",
                "nice",
                "ionice",
                "setsid",
                "chronic",
                "unbuffer",
                "stdbuf",
                "strace",
                "ltrace",
                "timeout",
                "env",
                "watch",
                "taskset",
                "chrt",
                "flock",
            ):
                takes_value = {
                    "-u",
                    "-g",
                    "-n",
                    "-s",
                    "-k",
                    "-C",
                    "-o",
                    "-e",
                    "-i",
                    "-c",
                    "-p",
                    "-S",
                    "--signal",
                    "--kill-after",
                }
                while rest and (rest[0].startswith("-") or "=" in rest[0]):
                    opt = rest.pop(0)
                    if opt in takes_value and rest and name not in ("env",):
                        rest.pop(0)
                if name in ("timeout", "taskset", "chrt", "flock") and rest:
                    rest = rest[1:]
                argv = rest
                continue
            if name == "busybox":
                argv = rest
                continue
            if name == "xargs":
                while rest and rest[0].startswith("-"):
                    opt = rest.pop(0)
                    if opt in ("-I", "-n", "-P", "-d", "-L", "-s", "-a", "-E") and rest:
                        rest.pop(0)
                extra = shlex.split(cmd.stdin, posix=True) if cmd.stdin and "\0" not in cmd.stdin else []
                argv = (rest or ["echo"]) + (extra if "{}" not in rest else [])
                continue
            if name in ("uv", "poetry", "pipenv", "pdm", "hatch", "conda", "mamba") and "run" in rest:
                rest = rest[rest.index("run") + 1 :]
                while rest and rest[0].startswith("-"):
                    opt = rest.pop(0)
                    if opt in ("-n", "--name", "-p", "--prefix", "--with", "--python") and rest:
                        rest.pop(0)
                argv = rest
                continue
            if name == "su" and "-c" in rest:
                i = rest.index("-c")
                return ["sh", "-c", rest[i + 1]] if i + 1 < len(rest) else []
            return argv
        return argv
