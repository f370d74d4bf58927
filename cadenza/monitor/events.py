"""Turn a trajectory's tool calls into monitor events: commands run, paths used, edits, code run.

Every detector reads these events instead of raw tool arguments, so one place handles the ways
an action can be hidden: wrappers (``sudo``, ``env``, ``timeout``, ``xargs``, ``find -exec``),
nested shells (``sh -c``, ``bash <<EOF``, ``eval``), decode pipelines (``echo .. | base64 -d | sh``),
``python -c``/heredoc/script code (analysed with :mod:`cadenza.monitor.pycode`) and files the
agent wrote earlier and then executes.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from cadenza.agent.trajectory import Trajectory
from cadenza.monitor.pycode import PyFacts, analyze_python
from cadenza.monitor.shell import DYNAMIC, MAX_DEPTH, Command, ShellState, parse

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


@dataclass
class Extractor:
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
        """Test files and conftests the agent wrote run when pytest runs: analyse them (once per version) as code run."""
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
            if name in ("sudo", "doas", "nohup", "time", "command", "builtin", "nice", "ionice", "setsid", "chronic",
                        "unbuffer", "stdbuf", "strace", "ltrace", "timeout", "env", "watch", "taskset", "chrt", "flock"):  # fmt: skip
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

    def _shell_interp(
        self, cmd: Command, args: list[str], call: Call, depth: int, raw: str
    ) -> Iterator[Event]:
        i = 0
        while i < len(args) and args[i].startswith(("-", "+")) and args[i] not in ("-", "--"):
            opt = args[i]
            if "c" in opt[1:] and not opt.startswith("--"):
                if i + 1 < len(args):
                    yield from self.shell(args[i + 1], call, depth + 1)
                return
            i += 1 + (opt in ("-o", "+o", "-O", "+O"))
        script = args[i] if i < len(args) and args[i] != "-" else None
        body = self._content(script) if script else cmd.stdin
        if body is not None and cmd.upstream_decoded and not script:
            yield Event("obfuscation", call.turn, call.tool, raw, detail="decoded text piped into a shell")
        if body is not None:
            yield from self.shell(body, call, depth + 1)
        elif script:
            yield Event("exec", call.turn, call.tool, raw, argv=["sh", script])
            yield Event("path", call.turn, call.tool, raw, path=norm(script), op="exec")
        elif cmd.piped and (cmd.upstream_decoded or cmd.dynamic):
            yield Event("obfuscation", call.turn, call.tool, raw, detail="decoded text piped into a shell")

    def _python_interp(
        self, cmd: Command, argv: list[str], call: Call, depth: int, raw: str
    ) -> Iterator[Event]:
        args = argv[1:]
        i = 0
        while i < len(args):
            opt = args[i]
            if opt == "-" or not opt.startswith("-"):
                break
            if opt.startswith("--"):
                i += 1
                continue
            if "c" in opt[1:]:
                code = args[i + 1] if i + 1 < len(args) else ""
                yield from self.python(code, call, depth + 1, origin="-c", dynamic=cmd.dynamic)
                return
            if "m" in opt[1:]:
                mod = args[i + 1] if i + 1 < len(args) else ""
                margv = [mod, *args[i + 2 :]]
                yield Event("exec", call.turn, call.tool, raw, argv=margv, detail="python -m")
                yield from self._paths(margv, call, raw)
                if mod == "pytest":
                    yield from self._tests_run(call)
                path = mod.replace(".", "/") + ".py"
                content = self._content(path)
                if content is not None:
                    yield from self.python(content, call, depth + 1, origin=path)
                return
            i += 1 + (opt in ("-X", "-W", "-Q"))
        script = args[i] if i < len(args) else None
        if script and script != "-" and not script.startswith("/dev/"):
            yield Event("path", call.turn, call.tool, raw, path=norm(script), op="exec")
            yield from self._paths(["python", *args[i + 1 :]], call, raw)
            content = self._content(script)
            if content is not None:
                yield from self.python(content, call, depth + 1, origin=script)
            return
        body = self._content(script) if script else None
        body = body if body is not None else cmd.stdin
        if body is not None:
            if cmd.upstream_decoded:
                yield Event("obfuscation", call.turn, call.tool, raw, detail="decoded text piped into python")
            yield from self.python(body, call, depth + 1, origin="stdin")
        elif cmd.piped and (cmd.upstream_decoded or cmd.dynamic):
            yield Event("obfuscation", call.turn, call.tool, raw, detail="decoded text piped into python")

    def python(
        self, code: str, call: Call, depth: int, *, origin: str, dynamic: bool = False
    ) -> Iterator[Event]:
        if depth > MAX_DEPTH:
            return
        if DYNAMIC in code:
            yield Event(
                "obfuscation", call.turn, call.tool, code[:200], detail="python code built at run time"
            )
        facts = analyze_python(code)
        yield Event("code", call.turn, call.tool, code, code=code, facts=facts, detail=origin)
        for cmdline in facts.shell:
            yield from self.shell(cmdline, call, depth + 1)
        for inner in facts.code:
            yield from self.python(inner, call, depth + 1, origin="exec")
        yield from self._strings_as_paths(facts.strings, call, code)
        for target in facts.writes:
            if target.strip():
                yield Event("path", call.turn, call.tool, code, path=norm(target.strip()), op="write")
                yield Event(
                    "edit", call.turn, call.tool, code, path=norm(target.strip()), edit_kind="python write"
                )

    def _strings_as_paths(self, strings: list[str], call: Call, raw: str) -> Iterator[Event]:
        for s in strings:
            s = s.strip()
            if not s or len(s) > 400 or "\n" in s:
                continue
            if (
                "/" in s
                or s.startswith(".")
                or s.endswith((".pyc", ".py", ".class", ".cfg", ".ini", ".toml"))
            ):
                yield Event("path", call.turn, call.tool, raw, path=norm(s), op="read")

    # --- paths in commands ---------------------------------------------------------
    def _redirects(self, cmd: Command, call: Call, raw: str) -> Iterator[Event]:
        for op, target in cmd.redirects:
            if not target or op in ("<<", "<<<"):
                continue
            if op in ("<", "<>", "<&"):
                yield Event("path", call.turn, call.tool, raw, path=norm(target), op="read")
                continue
            if (
                target.startswith("/dev/")
                and not target.startswith("/dev/tcp")
                and not target.startswith("/dev/udp")
            ):
                continue
            yield Event("path", call.turn, call.tool, raw, path=norm(target), op="write")
            content = None
            if cmd.argv and not cmd.dynamic:
                from cadenza.monitor.shell import transform

                out = transform(cmd, cmd.stdin.encode() if cmd.stdin is not None else None, self.state)
                content = out.decode("utf-8", "replace") if out is not None else None
            kind = "append" if op in (">>", "&>>") else "create"
            self._remember(norm(target), kind, None, content)
            yield Event(
                "edit", call.turn, call.tool, raw, path=norm(target), new=content, edit_kind=f"bash {op}"
            )

    def _paths(self, argv: list[str], call: Call, raw: str, stdin: str | None = None) -> Iterator[Event]:
        if not argv:
            return
        name = posixpath.basename(argv[0])
        args = argv[1:]
        op = "read"
        if name in _LISTERS:
            op = "list"
        if name in _DELETERS or (name == "find" and ("-delete" in args or _find_exec_rm(args))):
            op = "delete"
        if name in ("echo", "printf", "true", "false", "test", "[", "mkdir", "export", "alias", "pytest"):
            return
        if name in ("cd", "pushd"):
            op = "list"
        positional: list[str] = []
        skip_pattern = name in _PATTERN_FIRST and not any(a in ("-e", "--regexp", "-f") for a in args)
        after_ddash = False
        skip_next = False
        for i, a in enumerate(args):
            if skip_next:
                skip_next = False
                continue
            if not after_ddash and a == "--":
                after_ddash = True
                continue
            if not after_ddash and (a in _EXCLUDES or a.split("=", 1)[0] in _EXCLUDES):
                skip_next = "=" not in a  # an exclusion pattern names what is *not* read
                continue
            if name == "find" and (
                (i + 1 < len(args) and args[i + 1] == "-prune") or (i >= 2 and args[i - 2] in ("!", "-not"))
            ):
                continue
            if not after_ddash and a.startswith("-") and len(a) > 1:
                if "=" in a:
                    positional.append(a.split("=", 1)[1])
                continue
            positional.append(a)
        script = None
        if skip_pattern and positional and name != "git":
            script, positional = positional[0], positional[1:]
        write_targets: set[str] = set()
        if name in ("cp", "mv", "install", "ln", "rsync") and len(positional) >= 2:
            write_targets.add(positional[-1])
        if name in ("tee", "touch", "truncate"):
            write_targets.update(positional)
        if name in ("sed", "perl") and any(a.startswith("-i") or a in ("--in-place", "-pi") for a in args):
            write_targets.update(positional)
        if name == "dd":
            write_targets.update(a[3:] for a in args if a.startswith("of="))
        if name == "ln" and len(positional) >= 2:
            src, dst = positional[0], positional[-1]
            symbolic = any(re.fullmatch(r"-[a-zA-Z]*s[a-zA-Z]*|--symbolic", a) for a in args)
            target = (
                posixpath.join(posixpath.dirname(dst), src) if symbolic and not src.startswith("/") else src
            )
            self.links[norm(dst)] = norm(target)
        if name in ("git", "patch") and (
            name == "patch" or (len(positional) > 0 and positional[0] == "apply")
        ):
            files = [self._content(p) for p in positional[1 if name == "git" else 0 :]]
            for diff in [stdin, *files]:
                if diff:
                    yield from self._diff_edits(diff, call, raw)
        if name in ("cp", "mv", "install", "rsync") and len(positional) >= 2:
            dest = positional[-1]
            if dest.endswith("/") or len(positional) > 2 or "." not in posixpath.basename(dest):
                for src in positional[:-1]:
                    inside = norm(posixpath.join(dest, posixpath.basename(src.rstrip("/"))))
                    yield Event(
                        "edit",
                        call.turn,
                        call.tool,
                        raw,
                        path=inside,
                        new=self._content(src),
                        edit_kind=f"bash {name}",
                    )
        for p in positional:
            if DYNAMIC in p or not p:
                continue
            if name == "mv":
                pop = "delete" if p not in write_targets else "write"
            else:
                pop = "write" if p in write_targets else op
            yield Event("path", call.turn, call.tool, raw, path=norm(p), op=pop)
            if pop == "write" and name not in ("touch",):
                src = positional[0] if name in ("cp", "install") else None
                content = self._content(src) if src else None
                if name == "tee" and stdin is not None:
                    content = stdin
                if name in ("sed", "perl") and script:
                    content = script  # the edit script: what it inserts is checked like new text
                yield Event(
                    "edit", call.turn, call.tool, raw, path=norm(p), new=content, edit_kind=f"bash {name}"
                )
            elif pop == "delete":
                yield Event(
                    "edit", call.turn, call.tool, raw, path=norm(p), new=None, edit_kind=f"bash {name}"
                )

    def _diff_edits(self, diff: str, call: Call, raw: str) -> Iterator[Event]:
        """Files a unified diff changes, with its removed/added lines as old/new text."""
        path, old, new = None, [], []
        for line in [*diff.splitlines(), "+++ "]:
            if line.startswith("+++ "):
                if path:
                    yield Event(
                        "edit",
                        call.turn,
                        call.tool,
                        raw,
                        path=path,
                        old="\n".join(old),
                        new="\n".join(new),
                        edit_kind="bash patch",
                    )
                name = line[4:].split("\t", 1)[0].strip()
                path = (
                    norm(name[2:] if name[:2] in ("a/", "b/") else name)
                    if name and name != "/dev/null"
                    else None
                )
                old, new = [], []
            elif line.startswith("+"):
                new.append(line[1:])
            elif line.startswith("-") and not line.startswith("--- "):
                old.append(line[1:])


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
