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

from cadenza.monitor.shell_lex import (
    _ASSIGN,
    DYNAMIC,
    KEYWORDS,
    MAX_DEPTH,
    Command,
    ShellState,
    Word,
    _Lexer,
)

__all__ = [
    "DYNAMIC",
    "MAX_DEPTH",
    "Command",
    "ShellState",
    "Word",
    "evaluate_output",
    "is_decoder",
    "parse",
    "transform",
]


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
    lexer = _Lexer(text, state, depth, evaluate_output)
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
    while cmd.argv and cmd.argv[0] in KEYWORDS:
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
