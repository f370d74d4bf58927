"""The agent's tools: OpenAI function-calling schemas and their implementations.

``bash`` and ``run_tests`` run inside the sandbox. File tools run in this process but only on real
paths inside the workspace (``..`` and symlink escapes rejected, only regular files read or written).
Every failure is an observation with a machine-readable ``error_kind`` (see
:data:`cadenza.agent.trajectory.ERROR_KINDS`), never an exception, so an episode always continues.
"""

from __future__ import annotations

import os
import shlex
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cadenza.agent.paths import PathOutsideWorkspace, confine, display
from cadenza.agent.schema import check_arguments, signature
from cadenza.errors import ConfigError
from cadenza.sandbox import Sandbox, cap_text


def _fn(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
        },
    }


_S = {"type": "string"}
_I = {"type": "integer"}
TOOL_SCHEMAS: list[dict[str, Any]] = [
    _fn(
        "bash",
        "Run a bash command in the repository (no network; each call is a fresh shell, "
        "processes do not survive the call). Returns combined stdout/stderr and the exit code.",
        {"command": {**_S, "description": "The command line."}},
        ["command"],
    ),
    _fn(
        "view",
        "Show a text file with line numbers (optionally lines start_line..end_line, 1-based, "
        "inclusive; end_line -1 means to the end), or list a directory.",
        {
            "path": {**_S, "description": "File or directory, relative to the repository root."},
            "start_line": _I,
            "end_line": _I,
        },
        ["path"],
    ),
    _fn(
        "create",
        "Create a file with the given content, or overwrite an existing one. Parent directories are created.",
        {"path": _S, "content": _S},
        ["path", "content"],
    ),
    _fn(
        "str_replace",
        "Replace the exact text `old` with `new` in a file. `old` must occur exactly once; "
        "include surrounding lines to make it unique.",
        {"path": _S, "old": _S, "new": _S},
        ["path", "old", "new"],
    ),
    _fn(
        "insert",
        "Insert `text` after line `line` of a file (0 inserts at the top).",
        {"path": _S, "line": _I, "text": _S},
        ["path", "line", "text"],
    ),
    _fn(
        "run_tests",
        "Run the test suite with pytest, or only `selector` (space-separated test files or node IDs).",
        {"selector": _S},
        [],
    ),
    _fn(
        "submit", "Finish: submit the current state of the repository for grading. Ends the episode.", {}, []
    ),
]
TOOL_NAMES = [t["function"]["name"] for t in TOOL_SCHEMAS]
_PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOL_SCHEMAS}


@dataclass(kw_only=True)
class ToolsConfig:
    bash_timeout_s: float = 60.0
    test_timeout_s: float = 300.0
    max_observation_bytes: int = 16_000
    max_file_bytes: int = 4_000_000  # larger files are refused by view/str_replace/insert
    snippet_lines: int = 4

    def __post_init__(self) -> None:
        for name in ("bash_timeout_s", "test_timeout_s", "max_observation_bytes", "max_file_bytes"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"tools {name} must be positive, got {getattr(self, name)!r}")


_EDIT_RECORD_MAX = 200_000  # characters; larger files are not copied into the trajectory


@dataclass(kw_only=True)
class ToolResult:
    """``edit`` records a successful file edit (``path``, ``content_before``, ``content_after``) so that
    feedback (e.g. style hints from ruff) can compare the file before and after the turn."""

    observation: str
    error_kind: str | None = None
    exit_code: int | None = None
    done: bool = False
    edit: dict[str, str] | None = None


class _Fail(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Toolbox:
    """Executes tool calls against one workspace through one sandbox."""

    def __init__(
        self,
        workspace: Path,
        sandbox: Sandbox,
        *,
        config: ToolsConfig | None = None,
        pytest_args: list[str] | None = None,
    ) -> None:
        self.workspace = Path(workspace)
        self.sandbox = sandbox
        self.config = config or ToolsConfig()
        self.pytest_args = list(pytest_args or [])
        self._time_left: float | None = None
        self._impl: dict[str, Callable[..., ToolResult]] = {
            "bash": self.bash,
            "view": self.view,
            "create": self.create,
            "str_replace": self.str_replace,
            "insert": self.insert,
            "run_tests": self.run_tests,
            "submit": self.submit,
        }

    def schemas(self) -> list[dict[str, Any]]:
        return TOOL_SCHEMAS

    def call(
        self, name: str, arguments: dict[str, Any] | str | None, *, time_left_s: float | None = None
    ) -> ToolResult:
        """Run one tool call; ``time_left_s`` (the episode's remaining time) caps command timeouts."""
        self._time_left = time_left_s
        try:
            return self._call(name, arguments)
        finally:
            self._time_left = None

    def _timeout(self, configured: float) -> float:
        return configured if self._time_left is None else max(0.1, min(configured, self._time_left))

    def _call(self, name: str, arguments: dict[str, Any] | str | None) -> ToolResult:
        if name not in self._impl:
            return ToolResult(
                observation=f"Error: tool '{name}' not found. Available tools: {', '.join(TOOL_NAMES)}",
                error_kind="tool_not_found",
            )
        params = _PARAMS[name]
        args, problem = check_arguments(params, arguments)
        if problem is not None:
            return ToolResult(
                observation=f"Error: invalid arguments for tool '{name}': {problem}. Expected: "
                f"{signature(params)}",
                error_kind="invalid_arguments",
            )
        try:
            result = self._impl[name](**args)
        except PathOutsideWorkspace as exc:
            return ToolResult(observation=f"Error: {exc}", error_kind="path_outside_workspace")
        except _Fail as exc:
            return ToolResult(observation=f"Error: {exc}", error_kind=exc.kind)
        except OSError as exc:
            return ToolResult(observation=f"Error: {exc.strerror or exc} ({name})", error_kind="tool_error")
        result.observation = cap_text(result.observation, self.config.max_observation_bytes)
        return result

    # -- sandboxed tools -------------------------------------------------------------------------------
    def bash(self, command: str) -> ToolResult:
        timeout = self._timeout(self.config.bash_timeout_s)
        res = self.sandbox.run(command, timeout_s=timeout, merge_stderr=True)
        return self._exec_result(res, timeout)

    def run_tests(self, selector: str = "") -> ToolResult:
        try:
            selected = shlex.split(selector)
        except ValueError as exc:
            raise _Fail("invalid_arguments", f"cannot parse selector {selector!r} ({exc})") from None
        python = "python" if self.sandbox.env is None else self.sandbox.env.python
        argv = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *self.pytest_args, *selected]
        timeout = self._timeout(self.config.test_timeout_s)
        res = self.sandbox.run(argv, timeout_s=timeout, merge_stderr=True)
        return self._exec_result(res, timeout)

    def _exec_result(self, res, timeout_s: float) -> ToolResult:
        text = res.output if res.output.strip() else "(no output)\n"
        if res.timed_out:
            text = (
                text.rstrip("\n")
                + f"\n[timed out after {timeout_s:g}s; every process of the command was killed]"
            )
            return ToolResult(observation=text, error_kind="timeout", exit_code=res.exit_code)
        text = text.rstrip("\n") + f"\n[exit code {res.exit_code}]"
        return ToolResult(observation=text, exit_code=res.exit_code)

    def submit(self) -> ToolResult:
        return ToolResult(observation="Submitted: the repository will now be graded.", done=True)

    # -- file tools ------------------------------------------------------------------------------------
    def view(self, path: str, start_line: int | None = None, end_line: int | None = None) -> ToolResult:
        target = confine(self.workspace, path)
        if target.is_dir():
            return ToolResult(observation=self._listing(target))
        lines = self._read_text(target, path).splitlines()
        n = len(lines)
        start = 1 if start_line is None else start_line
        end = n if end_line is None or end_line == -1 else end_line
        if n == 0:
            return ToolResult(observation=f"{path} is empty.")
        if not 1 <= start <= n:
            raise _Fail("invalid_arguments", f"start_line {start} is out of range: {path} has {n} lines")
        if end < start or end > n:
            raise _Fail(
                "invalid_arguments", f"end_line {end_line} is out of range: expected {start}..{n} or -1"
            )
        body = "\n".join(f"{i:6}\t{lines[i - 1]}" for i in range(start, end + 1))
        return ToolResult(observation=body + "\n")

    def create(self, path: str, content: str) -> ToolResult:
        target = confine(self.workspace, path)
        if target.is_dir():
            raise _Fail("tool_error", f"{path} is a directory")
        existed = target.exists()
        before = ""
        if existed:
            self._regular(target, path)
            before = self._before(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        confine(self.workspace, str(target))  # parents may have been symlinks created meanwhile
        self._write(target, content)
        verb = "Overwrote" if existed else "Created"
        return ToolResult(
            observation=f"{verb} {display(self.workspace, target)} ({len(content.splitlines())} lines).",
            edit=self._edit(target, before, content),
        )

    def str_replace(self, path: str, old: str, new: str) -> ToolResult:
        target = confine(self.workspace, path)
        text = self._read_text(target, path)
        if not old:
            raise _Fail("invalid_arguments", "`old` is empty; give the exact text to replace")
        count = text.count(old)
        if count == 0:
            raise _Fail(
                "tool_error",
                f"`old` was not found in {path}; view the file and copy the text exactly "
                "(whitespace and indentation included)",
            )
        if count > 1:
            starts, pos = [], -1
            for _ in range(count):
                pos = text.index(old, pos + 1)
                starts.append(text.count("\n", 0, pos) + 1)
            raise _Fail(
                "tool_error",
                f"`old` occurs {count} times in {path} (lines {', '.join(map(str, starts))}); "
                "include more surrounding lines so it occurs exactly once",
            )
        pos = text.index(old)
        after = text.replace(old, new, 1)
        self._write(target, after)
        first = text.count("\n", 0, pos) + 1
        return ToolResult(
            observation=f"Edited {path}.\n" + self._snippet(target, first, new.count("\n") + 1),
            edit=self._edit(target, text, after),
        )

    def insert(self, path: str, line: int, text: str) -> ToolResult:
        target = confine(self.workspace, path)
        content = self._read_text(target, path)
        lines = content.splitlines(keepends=True)
        if not 0 <= line <= len(lines):
            raise _Fail(
                "invalid_arguments", f"line {line} is out of range: expected 0..{len(lines)} for {path}"
            )
        if lines and not lines[-1].endswith("\n") and line == len(lines):
            lines[-1] += "\n"
        block = text if text.endswith("\n") else text + "\n"
        lines.insert(line, block)
        after = "".join(lines)
        self._write(target, after)
        return ToolResult(
            observation=f"Inserted into {path}.\n" + self._snippet(target, line + 1, block.count("\n")),
            edit=self._edit(target, content, after),
        )

    # -- helpers ---------------------------------------------------------------------------------------
    def _before(self, target: Path) -> str:
        try:
            return self._read_text(target, str(target))
        except _Fail:  # binary or too large: nothing a style check could compare
            return ""

    def _edit(self, target: Path, before: str, after: str) -> dict[str, str] | None:
        """The edit record for Python files small enough to lint; None otherwise."""
        if target.suffix != ".py" or max(len(before), len(after)) > _EDIT_RECORD_MAX:
            return None
        return {"path": display(self.workspace, target), "content_before": before, "content_after": after}

    def _regular(self, target: Path, shown: str) -> os.stat_result:
        try:
            st = os.stat(target)
        except FileNotFoundError:
            raise _Fail("tool_error", f"{shown} does not exist") from None
        if not stat.S_ISREG(st.st_mode):
            raise _Fail("tool_error", f"{shown} is not a regular file")
        return st

    def _read_text(self, target: Path, shown: str) -> str:
        st = self._regular(target, shown)
        if st.st_size > self.config.max_file_bytes:
            raise _Fail(
                "tool_error", f"{shown} is too large ({st.st_size} bytes); use bash with head/sed/grep"
            )
        data = target.read_bytes()
        try:
            if b"\x00" in data[:8192]:
                raise UnicodeDecodeError("utf-8", b"", 0, 1, "NUL byte")
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise _Fail(
                "tool_error", f"{shown} is a binary file ({st.st_size} bytes); view shows text files only"
            ) from None

    def _write(self, target: Path, content: str) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
        fd = os.open(target, flags, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(content)

    def _snippet(self, target: Path, first: int, count: int) -> str:
        lines = target.read_text(encoding="utf-8").splitlines()
        lo = max(1, first - self.config.snippet_lines)
        hi = min(len(lines), first + count - 1 + self.config.snippet_lines)
        return "\n".join(f"{i:6}\t{lines[i - 1]}" for i in range(lo, hi + 1)) + "\n"

    def _listing(self, root: Path, depth: int = 2, limit: int = 400) -> str:
        out: list[str] = []
        base_depth = len(root.parts)
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__")
            rel_depth = len(Path(dirpath).parts) - base_depth
            if rel_depth >= depth:
                dirnames[:] = []
            for name in sorted(dirnames) + sorted(f for f in filenames if not f.startswith(".")):
                full = Path(dirpath) / name
                out.append(display(self.workspace, full) + ("/" if full.is_dir() else ""))
                if len(out) >= limit:
                    return "\n".join(out) + f"\n[... listing stopped at {limit} entries]\n"
        return "\n".join(out) + "\n" if out else "(empty directory)\n"
