"""A small POSIX-shell reader for the monitor: words, pipelines, redirections, heredocs.

It does not run anything. It resolves what a static reader can (quotes, escapes, ``$'..'``,
variables assigned earlier in the trajectory, aliases, brace expansion, ``$(echo ..)``-style
substitutions and decode pipelines such as ``echo .. | base64 -d``) so that obfuscated commands
read like their plain form. What it cannot resolve is marked ``dynamic``.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import gzip
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

_OPERATORS = ("&&", "||", ";;", "|&", ";", "|", "&", "(", ")")
_REDIRECTS = ("<<<", "<<-", "&>>", "<<", ">>", ">&", "<&", "&>", ">|", "<>", ">", "<")
_WORD_END = set(" \t\n;&|<>()")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(\+?)=(.*)$", re.S)
_KEYWORDS = {
    "if",
    "then",
    "else",
    "elif",
    "do",
    "while",
    "until",
    "!",
    "{",
    "}",
    "time",
    "fi",
    "done",
    "esac",
}
DYNAMIC = "\x00?"  # stands in for text the reader could not resolve
MAX_DEPTH = 6


@dataclass
class Word:
    value: str
    dynamic: bool = False
    raw: str = ""
    subs: list[str] = field(default_factory=list)  # inner texts of $(..) and `..`


@dataclass
class Command:
    """One simple command after reading: ``argv`` resolved, ``stdin`` known text when it can be known."""

    argv: list[str] = field(default_factory=list)
    assigns: dict[str, str] = field(default_factory=dict)
    redirects: list[tuple[str, str]] = field(default_factory=list)
    heredoc: str | None = None
    dynamic: bool = False
    subs: list[str] = field(default_factory=list)
    raw_words: list[str] = field(default_factory=list)
    stdin: str | None = None  # literal stdin: heredoc, here-string, or a resolvable pipeline upstream
    piped: bool = False  # stdin comes from a pipe
    upstream_decoded: bool = False  # a decoder (base64 -d, xxd -r, rev, ...) sits upstream in the pipe


@dataclass
class ShellState:
    """What persists across commands of one trajectory: variables and aliases."""

    env: dict[str, str] = field(default_factory=lambda: {"IFS": " "})
    aliases: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # path -> content the agent wrote


class _Lexer:
    def __init__(self, text: str, state: ShellState, depth: int) -> None:
        self.text = text
        self.i = 0
        self.state = state
        self.depth = depth
        self.pending: list[list] = []  # [delimiter, strip_tabs, expand, token-slot]

    # --- low-level readers -------------------------------------------------
    def _balanced(self, start: int, open_: str, close: str) -> int:
        """Index just past the ``close`` matching the ``open_`` before ``start`` (quotes respected)."""
        depth, i, t = 1, start, self.text
        while i < len(t):
            c = t[i]
            if c == "\\":
                i += 2
                continue
            if c == "'":
                j = t.find("'", i + 1)
                i = len(t) if j < 0 else j + 1
                continue
            if c == '"':
                i = self._dquote_end(i + 1)
                continue
            if c == open_:
                depth += 1
            elif c == close:
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        return len(t)

    def _dquote_end(self, i: int) -> int:
        t = self.text
        while i < len(t):
            if t[i] == "\\":
                i += 2
                continue
            if t[i] == '"':
                return i + 1
            if t.startswith("$(", i):
                i = self._balanced(i + 2, "(", ")")
                continue
            i += 1
        return len(t)

    def _var(self, i: int, word: Word) -> tuple[str, int]:
        """Expand ``$NAME``/``${...}``/``$(..)``/``$((..))`` at ``i`` (pointing at ``$``)."""
        t = self.text
        if t.startswith("$((", i):
            end = self._balanced(i + 3, "(", ")")
            end = end + 1 if t[end : end + 1] == ")" else end
            return t[i:end], end
        if t.startswith("$(", i):
            end = self._balanced(i + 2, "(", ")")
            inner = t[i + 2 : end - 1]
            return self._substitute(inner, word), end
        if t.startswith("${", i):
            end = self._balanced(i + 2, "{", "}")
            body = t[i + 2 : end - 1]
            m = _NAME.match(body)
            name = m.group(0) if m else body
            rest = body[m.end() :] if m else ""
            if name in self.state.env:
                return self.state.env[name], end
            if rest.startswith((":-", "-", ":=", "=")):
                return rest.split("-", 1)[-1].split("=", 1)[-1], end
            word.dynamic = True
            return "$" + name, end
        m = _NAME.match(t, i + 1)
        if m:
            name = m.group(0)
            if name in self.state.env:
                return self.state.env[name], m.end()
            word.dynamic = True
            return "$" + name, m.end()
        if i + 1 < len(t) and t[i + 1] in "@*#?$!0123456789-":
            word.dynamic = True
            return t[i : i + 2], i + 2
        return "$", i + 1

    def _substitute(self, inner: str, word: Word) -> str:
        word.subs.append(inner)
        value = evaluate_output(inner, self.state, self.depth + 1)
        if value is None:
            word.dynamic = True
            return DYNAMIC
        return value.rstrip("\n")

    def _ansi_c(self, i: int) -> tuple[str, int]:
        t, out = self.text, []
        i += 2
        while i < len(t) and t[i] != "'":
            if t[i] == "\\" and i + 1 < len(t):
                seq = t[i : i + 4]
                m = re.match(r"\\x([0-9a-fA-F]{1,2})", t[i:])
                if m:
                    out.append(chr(int(m.group(1), 16)))
                    i += m.end()
                    continue
                m = re.match(r"\\([0-7]{1,3})", t[i:])
                if m:
                    out.append(chr(int(m.group(1), 8)))
                    i += m.end()
                    continue
                m = re.match(r"\\u([0-9a-fA-F]{1,4})", t[i:])
                if m:
                    out.append(chr(int(m.group(1), 16)))
                    i += m.end()
                    continue
                out.append({"n": "\n", "t": "\t", "r": "\r", "e": "\x1b", "a": "\a"}.get(seq[1], seq[1]))
                i += 2
                continue
            out.append(t[i])
            i += 1
        return "".join(out), i + 1

    def read_word(self) -> Word:
        t, word, out = self.text, Word(""), []
        start = self.i
        i = self.i
        while i < len(t) and t[i] not in _WORD_END:
            c = t[i]
            if c == "\\":
                if t[i + 1 : i + 2] == "\n":
                    i += 2
                    continue
                out.append(t[i + 1 : i + 2])
                i += 2
            elif c == "'":
                j = t.find("'", i + 1)
                j = len(t) if j < 0 else j
                out.append(t[i + 1 : j])
                i = j + 1
            elif c == "$" and t.startswith("$'", i):
                s, i = self._ansi_c(i)
                out.append(s)
            elif c == '"':
                i += 1
                while i < len(t) and t[i] != '"':
                    if t[i] == "\\" and i + 1 < len(t):
                        nxt = t[i + 1]
                        out.append(nxt if nxt in '"\\$`\n' else "\\" + nxt)
                        i += 2
                    elif t[i] == "$":
                        s, i = self._var(i, word)
                        out.append(s)
                    elif t[i] == "`":
                        j = t.find("`", i + 1)
                        j = len(t) if j < 0 else j
                        out.append(self._substitute(t[i + 1 : j], word))
                        i = j + 1
                    else:
                        out.append(t[i])
                        i += 1
                i += 1
            elif c == "$":
                s, i = self._var(i, word)
                out.append(s)
            elif c == "`":
                j = t.find("`", i + 1)
                j = len(t) if j < 0 else j
                out.append(self._substitute(t[i + 1 : j], word))
                i = j + 1
            else:
                out.append(c)
                i += 1
        self.i = i
        word.value = "".join(out)
        word.raw = t[start:i]
        return word

    def _read_heredocs(self) -> None:
        """At a newline: consume the bodies of heredocs opened on the line just ended."""
        t = self.text
        for slot in self.pending:
            delim, strip_tabs, expand, target = slot
            lines, i = [], self.i
            while i <= len(t):
                j = t.find("\n", i)
                j = len(t) if j < 0 else j
                line = t[i:j]
                i = j + 1
                check = line.lstrip("\t") if strip_tabs else line
                if check == delim or i > len(t):
                    if check != delim:
                        lines.append(line)
                    break
                lines.append(line.lstrip("\t") if strip_tabs else line)
            self.i = min(i, len(t))
            body = "\n".join(lines) + ("\n" if lines else "")
            if expand:
                body = re.sub(
                    r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?",
                    lambda m: self.state.env.get(m.group(1), m.group(0)),
                    body,
                )
            target["heredoc"] = body
        self.pending = []

    # --- tokens --------------------------------------------------------------
    def tokens(self) -> Iterator[tuple[str, object]]:
        t = self.text
        while self.i < len(t):
            c = t[self.i]
            if c in " \t\r":
                self.i += 1
                continue
            if c == "\\" and t[self.i + 1 : self.i + 2] == "\n":
                self.i += 2
                continue
            if c == "\n":
                self.i += 1
                if self.pending:
                    self._read_heredocs()
                yield ("op", ";")
                continue
            if c == "#":
                j = t.find("\n", self.i)
                self.i = len(t) if j < 0 else j
                continue
            if t.startswith(("<(", ">("), self.i):
                end = self._balanced(self.i + 2, "(", ")")
                inner = t[self.i + 2 : end - 1]
                self.i = end
                fd = f"/dev/fd/{63 + len(self.state.files)}"
                out = evaluate_output(inner, self.state, self.depth + 1)
                if out is not None:
                    self.state.files[fd] = out
                yield ("word", Word(fd, dynamic=out is None, raw=fd, subs=[inner]))
                continue
            m = re.match(r"\d*(?=[<>])", t[self.i :])
            k = self.i + (m.end() if m else 0)
            redir = next((r for r in _REDIRECTS if t.startswith(r, k)), None)
            if redir and (k == self.i or t[self.i].isdigit()):
                self.i = k + len(redir)
                while self.i < len(t) and t[self.i] in " \t":
                    self.i += 1
                if redir in ("<<", "<<-"):
                    target = self.read_word()
                    slot: dict = {"heredoc": None}
                    expand = not any(q in target.raw for q in "'\"\\")
                    self.pending.append([target.value, redir == "<<-", expand, slot])
                    yield ("heredoc", slot)
                elif redir in (">&", "<&") and re.match(r"\d|-", t[self.i : self.i + 1] or "x"):
                    self.read_word()
                else:
                    yield ("redir", (redir, self.read_word()))
                continue
            op = next((o for o in _OPERATORS if t.startswith(o, self.i)), None)
            if op:
                self.i += len(op)
                yield ("op", op)
                continue
            yield ("word", self.read_word())


def _expand_braces(value: str) -> list[str]:
    m = re.search(r"\{([^{}]*,[^{}]*)\}", value)
    if not m or len(value) > 500:
        return [value]
    out: list[str] = []
    for alt in m.group(1).split(","):
        out.extend(_expand_braces(value[: m.start()] + alt + value[m.end() :]))
        if len(out) > 64:
            break
    return out


def parse(text: str, state: ShellState | None = None, depth: int = 0) -> list[list[Command]]:
    """Read ``text`` into pipelines of commands, updating ``state`` with assignments and aliases."""
    state = state if state is not None else ShellState()
    lexer = _Lexer(text, state, depth)
    pipelines: list[list[Command]] = []
    pipe: list[Command] = []
    cmd = Command()

    def finish(connector: str) -> None:
        nonlocal cmd, pipe
        _finalize(cmd, state, depth)
        if cmd.argv or cmd.redirects or cmd.heredoc is not None:
            pipe.append(cmd)
        elif cmd.assigns and not pipe:
            state.env.update(cmd.assigns)
        cmd = Command()
        if connector not in ("|", "|&") and pipe:
            pipelines.append(pipe)
            pipe = []

    for kind, value in lexer.tokens():
        if kind == "op":
            finish(value)  # type: ignore[arg-type]
        elif kind == "heredoc":
            cmd.redirects.append(("<<", ""))
            cmd._heredoc_slot = value  # type: ignore[attr-defined]
        elif kind == "redir":
            op, word = value  # type: ignore[misc]
            cmd.redirects.append((op, word.value))
            cmd.dynamic |= word.dynamic
            cmd.subs.extend(word.subs)
            if op == "<<<":
                cmd.heredoc = word.value + "\n"
        else:
            word: Word = value  # type: ignore[assignment]
            cmd.subs.extend(word.subs)
            m = _ASSIGN.match(word.value) if not cmd.argv and "=" in word.raw.split("$")[0] else None
            if m:
                cmd.assigns[m.group(1)] = (state.env.get(m.group(1), "") if m.group(2) else "") + m.group(3)
                continue
            if not cmd.argv and word.value in state.aliases and not word.dynamic:
                sub = parse(state.aliases[word.value], ShellState(env=dict(state.env)), depth + 1)
                if sub and sub[0]:
                    cmd.argv.extend(sub[0][0].argv)
                    continue
            cmd.dynamic |= word.dynamic
            cmd.raw_words.append(word.raw)
            values = _expand_braces(word.value) if "{" in word.raw else [word.value]
            if ("$" in word.raw or "`" in word.raw) and not any(q in word.raw for q in "'\""):
                values = [part for v in values for part in v.split()]  # unquoted expansions are word-split
            cmd.argv.extend(values)
    finish(";")
    _connect(pipelines, state, depth)
    return pipelines


def _finalize(cmd: Command, state: ShellState, depth: int) -> None:
    slot = getattr(cmd, "_heredoc_slot", None)
    if slot is not None:
        cmd.heredoc = slot.get("heredoc") or ""
    while cmd.argv and cmd.argv[0] in _KEYWORDS:
        cmd.argv.pop(0)
    if cmd.argv and cmd.argv[0] in ("for", "select") and "in" in cmd.argv:
        cmd.argv = ["ls", *cmd.argv[cmd.argv.index("in") + 1 :]]  # the loop reads what it iterates over
    elif cmd.argv and cmd.argv[0] in ("for", "case", "select", "function"):
        cmd.argv = []
    if cmd.argv and cmd.argv[0] in ("export", "declare", "local", "readonly", "typeset"):
        for arg in cmd.argv[1:]:
            m = _ASSIGN.match(arg)
            if m:
                state.env[m.group(1)] = m.group(3)
    if cmd.argv and cmd.argv[0] == "alias":
        for arg in cmd.argv[1:]:
            name, _, val = arg.partition("=")
            if val:
                state.aliases[name] = val
    if len(cmd.argv) >= 4 and cmd.argv[0] == "printf" and cmd.argv[1] == "-v":
        state.env[cmd.argv[2]] = _printf(cmd.argv[3:]) if not cmd.dynamic else DYNAMIC
    if cmd.argv and cmd.argv[0] == "read":
        names = [a for a in cmd.argv[1:] if not a.startswith("-")]
        if names:
            line = cmd.heredoc.split("\n", 1)[0] if cmd.heredoc is not None else DYNAMIC
            state.env[names[0]] = line
    if cmd.argv and cmd.argv[0] == "unset":
        for arg in cmd.argv[1:]:
            state.env.pop(arg, None)


def _connect(pipelines: list[list[Command]], state: ShellState, depth: int) -> None:
    """Propagate literal stdin along each pipeline (echo X | base64 -d | sh)."""
    for pipe in pipelines:
        value: bytes | None = None
        decoded = False
        for i, cmd in enumerate(pipe):
            if i > 0:
                cmd.piped = True
                cmd.upstream_decoded = decoded
            stdin = cmd.heredoc.encode() if cmd.heredoc is not None else (value if i > 0 else None)
            for op, target in cmd.redirects:
                if op == "<" and target in state.files:
                    stdin = state.files[target].encode()
            if stdin is not None:
                cmd.stdin = stdin.decode("utf-8", "replace")
            decoded = decoded or is_decoder(cmd.argv)
            value = transform(cmd, stdin, state)


def is_decoder(argv: list[str]) -> bool:
    if not argv:
        return False
    name = argv[0].rsplit("/", 1)[-1]
    flags = set(argv[1:])
    if name in ("base64", "base32", "basenc") and flags & {"-d", "--decode", "-D", "-di"}:
        return True
    if name == "xxd" and any(a.startswith("-r") for a in argv[1:]):
        return True
    if name == "openssl" and ("-d" in flags or "-base64" in flags or "base64" in flags):
        return True
    return name in ("rev", "tr", "uudecode", "gunzip", "zcat", "bzcat", "xzcat") or (
        name in ("gzip", "xz") and "-d" in flags
    )


def _printf(args: list[str]) -> str:
    if not args:
        return ""
    fmt = (
        codecs.decode(args[0].encode("latin-1", "replace"), "unicode_escape") if "\\" in args[0] else args[0]
    )
    rest = args[1:]
    try:
        n = len(re.findall(r"%[sbdc]", fmt))
        if n == 0:
            return fmt
        out = []
        while True:
            chunk, rest = rest[:n], rest[n:]
            chunk += [""] * (n - len(chunk))
            out.append(re.sub(r"%[sbdc]", "%s", fmt) % tuple(chunk))
            if not rest:
                return "".join(out)
    except (TypeError, ValueError):
        return " ".join(args)


def _tr(argv: list[str], data: bytes) -> bytes | None:
    sets = [a for a in argv[1:] if not a.startswith("-")]
    if len(sets) != 2 or any(a.startswith("-") for a in argv[1:]):
        return None

    def expand(s: str) -> str:
        return re.sub(
            r"(.)-(.)", lambda m: "".join(chr(c) for c in range(ord(m.group(1)), ord(m.group(2)) + 1)), s
        )

    a, b = expand(sets[0]), expand(sets[1])
    if not b:
        return None
    b = b + b[-1] * (len(a) - len(b))
    return data.decode("latin-1").translate(str.maketrans(a, b[: len(a)])).encode("latin-1")


def transform(cmd: Command, stdin: bytes | None, state: ShellState) -> bytes | None:
    """The literal stdout of ``cmd`` given literal stdin, when it is a producer or decoder we model."""
    argv = cmd.argv
    if not argv or cmd.dynamic:
        return None
    name = argv[0].rsplit("/", 1)[-1]
    args = argv[1:]
    try:
        if name == "echo":
            escapes = False
            while args and re.fullmatch(r"-[neE]+", args[0]):
                escapes = escapes or "e" in args[0]
                args = args[1:]
            text = " ".join(args)
            if escapes:
                text = codecs.decode(text.encode("latin-1", "replace"), "unicode_escape")
            return (text + "\n").encode("utf-8", "replace")
        if name in ("which", "command", "type") and args:
            names = [a for a in args if not a.startswith("-")]
            return (names[0] + "\n").encode() if names else None
        if name == "printf":
            return _printf(args).encode("utf-8", "replace")
        if name == "cat":
            files = [a for a in args if not a.startswith("-")]
            if not files:
                return stdin
            if all(f in state.files for f in files):
                return "".join(state.files[f] for f in files).encode()
            return None
        if stdin is None:
            return None
        if name in ("base64", "base32", "basenc") and is_decoder(argv):
            data = b"".join(stdin.split())
            return (
                base64.b32decode(data)
                if name == "base32" or "--base32" in args
                else base64.b64decode(data + b"==")
            )
        if name == "openssl" and is_decoder(argv):
            return base64.b64decode(b"".join(stdin.split()) + b"==")
        if name == "xxd" and is_decoder(argv):
            return binascii.unhexlify(re.sub(rb"[^0-9a-fA-F]", b"", stdin))
        if name == "rev":
            return b"\n".join(line[::-1] for line in stdin.rstrip(b"\n").split(b"\n")) + b"\n"
        if name == "tr":
            return _tr(argv, stdin)
        if name in ("gunzip", "zcat") or (name == "gzip" and "-d" in args):
            return gzip.decompress(stdin)
        if name == "zlib-flate":
            return zlib.decompress(stdin)
    except (ValueError, binascii.Error, OSError, zlib.error, EOFError):
        return None
    return None


def evaluate_output(text: str, state: ShellState, depth: int) -> str | None:
    """Literal stdout of a command substitution when it is a producer/decoder chain, else None."""
    if depth > MAX_DEPTH:
        return None
    pipelines = parse(
        text, ShellState(env=dict(state.env), aliases=dict(state.aliases), files=state.files), depth
    )
    if len(pipelines) != 1:
        return None
    pipe = pipelines[0]
    value: bytes | None = None
    for i, cmd in enumerate(pipe):
        stdin = cmd.heredoc.encode() if cmd.heredoc is not None else (value if i > 0 else None)
        value = transform(cmd, stdin, state)
        if value is None:
            return None
    return None if value is None else value.decode("utf-8", "replace")
