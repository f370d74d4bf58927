"""Static facts about a Python snippet the agent ran: imports, called names, folded strings, sinks.

Strings are constant-folded through the usual obfuscations (concatenation, ``''.join``, ``chr``,
``bytes.fromhex``, ``base64``/``codecs`` decoding, slicing such as ``[::-1]``, f-strings and
simple variables), so ``open('.g' + 'it/HEAD')`` reads as ``.git/HEAD``.
"""

from __future__ import annotations

import ast
import base64
import binascii
import codecs
import re
import zlib
from dataclasses import dataclass, field
from typing import Any

_SHELL_SINKS = {
    "os.system", "os.popen", "subprocess.run", "subprocess.call", "subprocess.check_call",
    "subprocess.check_output", "subprocess.Popen", "subprocess.getoutput", "subprocess.getstatusoutput",
    "pty.spawn", "os.spawnl", "os.spawnlp", "os.spawnv", "os.spawnvp", "os.execl", "os.execlp",
    "os.execv", "os.execvp", "os.execve", "os.execvpe", "commands.getoutput", "os.spawnve", "os.spawnvpe",
    "os.execle", "os.execlpe", "os.posix_spawn", "os.posix_spawnp", "asyncio.create_subprocess_shell",
    "asyncio.create_subprocess_exec",
}  # fmt: skip
_EXEC_SINKS = {"exec", "eval", "compile", "builtins.exec", "builtins.eval", "runpy.run_path"}
_DECODERS = {
    "base64.b64decode", "base64.b32decode", "base64.b16decode", "base64.a85decode", "base64.b85decode",
    "base64.decodebytes", "base64.urlsafe_b64decode", "codecs.decode", "bytes.fromhex", "binascii.unhexlify",
    "binascii.a2b_base64", "zlib.decompress", "gzip.decompress", "bz2.decompress", "lzma.decompress",
    "marshal.loads", "pickle.loads",
}  # fmt: skip


@dataclass
class PyFacts:
    parsed: bool = True
    imports: set[str] = field(default_factory=set)
    names: set[str] = field(default_factory=set)  # dotted names referenced (calls and attributes)
    calls: set[str] = field(default_factory=set)  # dotted names called
    strings: list[str] = field(default_factory=list)  # every folded string constant
    shell: list[str] = field(default_factory=list)  # folded commands given to os.system/subprocess
    code: list[str] = field(default_factory=list)  # folded code given to exec/eval
    dynamic_exec: list[str] = field(default_factory=list)  # exec/eval/import of values we could not fold
    decoders: set[str] = field(default_factory=set)
    writes: list[str] = field(default_factory=list)  # folded paths the code writes, moves or deletes


class _Folder(ast.NodeVisitor):
    def __init__(self) -> None:
        self.facts = PyFacts()
        self.env: dict[str, Any] = {}
        self.aliases: dict[str, str] = {}  # local name -> dotted module/function path
        self.paths: dict[str, str] = {}  # local name -> folded path of a pathlib.Path it holds

    # --- names ----------------------------------------------------------------
    def dotted(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = self.dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        if isinstance(node, ast.Call):
            inner = self.dotted(node.func)
            if inner in ("__import__", "importlib.import_module") and node.args:
                mod = self.fold(node.args[0])
                return mod if isinstance(mod, str) else None
            if inner == "getattr" and len(node.args) >= 2:
                base, attr = self.dotted(node.args[0]), self.fold(node.args[1])
                return f"{base}.{attr}" if base and isinstance(attr, str) else None
        return None

    # --- constant folding -------------------------------------------------------
    def fold(self, node: ast.AST | None) -> Any:
        if node is None:
            return None
        if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes | int):
            return node.value
        if isinstance(node, ast.Name):
            return self.env.get(node.id)
        if isinstance(node, ast.JoinedStr):
            parts = []
            for v in node.values:
                val = self.fold(v.value) if isinstance(v, ast.FormattedValue) else self.fold(v)
                if not isinstance(val, str | int):
                    return None
                parts.append(str(val))
            return "".join(parts)
        if isinstance(node, ast.BinOp):
            left, right = self.fold(node.left), self.fold(node.right)
            if isinstance(node.op, ast.Add) and type(left) is type(right) and isinstance(left, str | bytes):
                return left + right
            if isinstance(node.op, ast.Mod) and isinstance(left, str):
                try:
                    return left % (tuple(right) if isinstance(right, list) else right)
                except (TypeError, ValueError):
                    return None
            if (
                isinstance(node.op, ast.Mult)
                and isinstance(left, str | bytes)
                and isinstance(right, int)
                and right < 64
            ):
                return left * right
            return None
        if isinstance(node, ast.List | ast.Tuple):
            vals = [self.fold(e) for e in node.elts]
            return vals if all(v is not None for v in vals) else None
        if isinstance(node, ast.Subscript):
            base = self.fold(node.value)
            if isinstance(base, str | bytes | list) and isinstance(node.slice, ast.Slice):
                lo, hi, st = (
                    self.fold(x) if x is not None else None
                    for x in (node.slice.lower, node.slice.upper, node.slice.step)
                )
                try:
                    return base[slice(lo, hi, st)]
                except (TypeError, ValueError):
                    return None
            return None
        if isinstance(node, ast.Call):
            try:
                return self._fold_call(node)
            except (ValueError, TypeError, OverflowError, MemoryError):  # folding is best effort
                return None
        return None

    def _fold_call(self, node: ast.Call) -> Any:
        func = node.func
        args = [self.fold(a) for a in node.args]
        name = self.dotted(func)
        if isinstance(func, ast.Attribute):
            obj = self.fold(func.value)
            if (
                func.attr == "join"
                and isinstance(obj, str)
                and args
                and isinstance(args[0], list)
                and all(isinstance(x, str) for x in args[0])
            ):
                return obj.join(args[0])
            if func.attr in ("decode", "encode") and isinstance(obj, str | bytes):
                try:
                    enc = args[0] if args and isinstance(args[0], str) else "utf-8"
                    if isinstance(obj, bytes) and func.attr == "decode":
                        return obj.decode(enc, "replace")
                    return obj.encode(enc) if isinstance(obj, str) else obj
                except (LookupError, TypeError):
                    return None
            if func.attr in ("replace", "upper", "lower", "strip", "format") and isinstance(obj, str):
                try:
                    return getattr(obj, func.attr)(*[a for a in args if a is not None])
                except (TypeError, ValueError, IndexError, KeyError):
                    return None
        if name == "chr" and args and isinstance(args[0], int):
            return chr(args[0]) if 0 <= args[0] < 0x110000 else None
        if name in ("str", "bytes") and args and isinstance(args[0], str | bytes):
            return args[0] if name == "str" or isinstance(args[0], bytes) else args[0].encode()
        if name in ("reversed",) and args and isinstance(args[0], str):
            return list(args[0][::-1])
        if name in _DECODERS:
            self.facts.decoders.add(name)
            data = args[0] if args else None
            if isinstance(data, str) and name != "codecs.decode":
                data = data.encode()
            try:
                if name in ("base64.b64decode", "base64.decodebytes", "binascii.a2b_base64"):
                    return base64.b64decode(data + b"==") if isinstance(data, bytes) else None
                if name == "base64.urlsafe_b64decode" and isinstance(data, bytes):
                    return base64.urlsafe_b64decode(data + b"==")
                if name == "base64.b32decode" and isinstance(data, bytes):
                    return base64.b32decode(data)
                if name == "base64.b16decode" and isinstance(data, bytes):
                    return base64.b16decode(data)
                if name in ("bytes.fromhex", "binascii.unhexlify") and isinstance(data, bytes):
                    return binascii.unhexlify(data)
                if name == "zlib.decompress" and isinstance(data, bytes):
                    return zlib.decompress(data)
                if (
                    name == "codecs.decode"
                    and isinstance(data, str | bytes)
                    and len(args) > 1
                    and isinstance(args[1], str)
                ):
                    return codecs.decode(data, args[1])  # type: ignore[arg-type]
            except (ValueError, binascii.Error, zlib.error, LookupError, TypeError):
                return None
        return None

    # --- visiting ---------------------------------------------------------------
    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self.facts.imports.add(a.name)
            self.aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        mod = node.module or ""
        self.facts.imports.add(mod)
        for a in node.names:
            self.facts.imports.add(f"{mod}.{a.name}")
            self.aliases[a.asname or a.name] = f"{mod}.{a.name}"

    def visit_Assign(self, node: ast.Assign) -> None:
        self.generic_visit(node)
        value = self.fold(node.value)
        dotted = self.dotted(node.value)
        if (
            isinstance(node.value, ast.Call)
            and (self.dotted(node.value.func) or "").endswith("Path")
            and node.value.args
        ):
            path = self.fold(node.value.args[0])
            for target in node.targets:
                if isinstance(target, ast.Name) and isinstance(path, str):
                    self.paths[target.id] = path
        for target in node.targets:
            if isinstance(target, ast.Name):
                if value is not None:
                    self.env[target.id] = value
                elif dotted and isinstance(node.value, ast.Call | ast.Attribute):
                    self.aliases[target.id] = dotted

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str):
            self.facts.strings.append(node.value)
        elif isinstance(node.value, bytes):
            self.facts.strings.append(node.value.decode("latin-1"))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        name = self.dotted(node)
        if name:
            self.facts.names.add(name)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        self.generic_visit(node)
        name = self.dotted(node.func)
        folded = self.fold(node)
        if isinstance(folded, str | bytes):
            self.facts.strings.append(folded.decode("latin-1") if isinstance(folded, bytes) else folded)
        for arg in node.args:
            v = self.fold(arg)
            if isinstance(v, str | bytes) and not isinstance(arg, ast.Constant):
                self.facts.strings.append(v.decode("latin-1") if isinstance(v, bytes) else v)
            elif isinstance(v, list):
                self.facts.strings.extend(x for x in v if isinstance(x, str))
        self._note_writes(node, name)
        if not name:
            return
        self.facts.names.add(name)
        self.facts.calls.add(name)
        if name in ("__import__", "importlib.import_module") and node.args:
            mod = self.fold(node.args[0])
            if isinstance(mod, str):
                self.facts.imports.add(mod)
            else:
                self.facts.dynamic_exec.append(f"{name}(<computed>)")
        first = self.fold(node.args[0]) if node.args else None
        if name in _SHELL_SINKS:
            command = self._command(node, name)
            if command is not None:
                self.facts.shell.append(command)
            else:
                self.facts.dynamic_exec.append(f"{name}(<computed>)")
        if name in _EXEC_SINKS:
            if isinstance(first, bytes):
                first = first.decode("utf-8", "replace")
            if isinstance(first, str):
                self.facts.code.append(first)
            elif node.args:
                self.facts.dynamic_exec.append(f"{name}(<computed>)")

    def _command(self, node: ast.Call, name: str) -> str | None:
        """The command line a process-spawning call runs, when it can be folded."""
        args = list(node.args)
        kw = next((k.value for k in node.keywords if k.arg == "args"), None)
        if not args and kw is not None:
            args = [kw]
        vals = [self.fold(a) for a in args]
        if name.startswith(("os.exec", "os.spawn")) or name.endswith("create_subprocess_exec"):
            # exec*(path, argv list) or exec*l(path, arg0, arg1, ...); spawn* take a mode first.
            rest = vals[1:] if not name.startswith("os.spawn") else vals[2:]
            lst = next((v for v in rest if isinstance(v, list)), None)
            parts = lst if lst is not None else rest
            if name.endswith("create_subprocess_exec"):
                parts = vals
            if parts and all(isinstance(v, str) for v in parts):
                return " ".join(_quote(v) for v in parts)
            return None
        first = vals[0] if vals else None
        if isinstance(first, str):
            return first
        if isinstance(first, list) and first and all(isinstance(x, str) for x in first):
            return " ".join(_quote(x) for x in first)
        return None

    def _note_writes(self, node: ast.Call, name: str | None) -> None:
        """Record the paths a call writes: open(.., 'w'), Path(..).write_text(), os.remove, shutil.copy dst,
        ..."""
        args = node.args
        targets: list[ast.AST] = []
        if name in ("open", "io.open", "codecs.open", "builtins.open") and args:
            mode = (
                self.fold(args[1])
                if len(args) > 1
                else next((self.fold(k.value) for k in node.keywords if k.arg == "mode"), "r")
            )
            if isinstance(mode, str) and any(c in mode for c in "wax+"):
                targets.append(args[0])
        elif name in _DELETE_FIRST and args:
            targets.append(args[0])
        elif name in _WRITE_SECOND and len(args) > 1:
            targets.extend(args[:2] if name in ("os.rename", "os.replace", "shutil.move") else args[1:2])
        elif isinstance(node.func, ast.Attribute) and node.func.attr in _PATH_WRITERS:
            base = node.func.value
            if isinstance(base, ast.Call) and (self.dotted(base.func) or "").endswith("Path") and base.args:
                targets.append(base.args[0])
            elif isinstance(base, ast.Name) and isinstance(self.env.get(base.id), str):
                targets.append(base)
            elif isinstance(base, ast.Name) and base.id in self.paths:
                self.facts.writes.append(self.paths[base.id])
        for t in targets:
            v = self.fold(t)
            if isinstance(v, str):
                self.facts.writes.append(v)


_DELETE_FIRST = {"os.remove", "os.unlink", "os.rmdir", "shutil.rmtree", "os.truncate", "os.removedirs"}
_WRITE_SECOND = {
    "os.rename",
    "os.replace",
    "shutil.move",
    "shutil.copy",
    "shutil.copy2",
    "shutil.copyfile",
    "shutil.copytree",
    "os.link",
    "os.symlink",
}
_PATH_WRITERS = {
    "write_text",
    "write_bytes",
    "unlink",
    "touch",
    "rename",
    "replace",
    "rmdir",
    "symlink_to",
    "hardlink_to",
}


def _quote(s: str) -> str:
    import shlex

    return shlex.quote(s)


_IMPORT_RE = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import|import\s+([\w., ]+))", re.M)


def analyze_python(code: str) -> PyFacts:
    """Facts about ``code``; when it does not parse, a regex reading of imports and strings."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        facts = PyFacts(parsed=False)
        for m in _IMPORT_RE.finditer(code):
            for mod in (m.group(1) or m.group(2) or "").split(","):
                if mod.strip():
                    facts.imports.add(mod.strip().split(" ")[0])
        facts.strings = re.findall(r"""['"]([^'"\n]{1,300})['"]""", code)
        facts.names = set(re.findall(r"\b[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)+", code))
        if re.search(
            r"""open\([^)]*['"][wax+]|write_text|write_bytes|os\.remove|unlink|shutil\.|rename\(|replace\(""",
            code,
        ):
            facts.writes = [
                s for s in facts.strings if "/" in s or s.endswith(".py")
            ]  # cannot tell which: assume all
        return facts
    folder = _Folder()
    folder.visit(tree)
    return folder.facts
