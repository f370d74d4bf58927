"""The lexer of the monitor's shell reader (:mod:`cadenza.monitor.shell`): words, quotes, expansions,
heredocs."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

_OPERATORS = ("&&", "||", ";;", "|&", ";", "|", "&", "(", ")")
_REDIRECTS = ("<<<", "<<-", "&>>", "<<", ">>", ">&", "<&", "&>", ">|", "<>", ">", "<")
_WORD_END = set(" \t\n;&|<>()")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(\+?)=(.*)$", re.S)
#: reserved words that may stand before a command's name (skipped when looking for argv[0])
KEYWORDS = frozenset(
    ["if", "then", "else", "elif", "do", "while", "until", "!", "{", "}", "time", "fi", "done", "esac"]
)
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


#: what a substitution's output is: the reader's own evaluator, passed in by
#: :func:`cadenza.monitor.shell.parse` so that the lexer, which recurses into it, does not import the reader
Evaluate = Callable[[str, ShellState, int], "str | None"]


class _Lexer:
    def __init__(self, text: str, state: ShellState, depth: int, evaluate: Evaluate) -> None:
        self.text = text
        self.i = 0
        self.state = state
        self.depth = depth
        self.evaluate = evaluate
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
        value = self.evaluate(inner, self.state, self.depth + 1)
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
                out = self.evaluate(inner, self.state, self.depth + 1)
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
