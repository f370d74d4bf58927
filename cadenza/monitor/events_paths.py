"""Events from paths: redirects, arguments that name files, interpreters running files, diffs."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator

from cadenza.monitor.event import (
    _DELETERS,
    _EXCLUDES,
    _LISTERS,
    _PATTERN_FIRST,
    Call,
    Event,
    _find_exec_rm,
    norm,
)
from cadenza.monitor.pycode import analyze_python
from cadenza.monitor.shell import DYNAMIC, MAX_DEPTH, Command


class PathEvents:
    """The half of :class:`~cadenza.monitor.events.Extractor` that turns paths and code into events."""

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
