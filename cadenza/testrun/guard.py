"""The in-process guard: a PEP 578 audit hook that ends the test process when workspace code reaches
for the process itself.

Stdlib only, never imported by the parent: :mod:`cadenza.testrun.boot` loads it by file path before
any workspace code runs. An audit hook cannot be removed by Python code once added, and this one keeps
no reference anyone can reach without an audited call (its state lives in closures; ``gc`` walks,
frame access and ``ctypes`` are themselves audited). It decides *who* caused an event from the stack:

- frame and code-object access (``sys._getframe``, ``tb_frame``, ``gi_frame``, ``__code__``, new code or
  function objects) counts against the frame that made the call, seen through the few stdlib wrappers
  that hand frames back (``inspect.currentframe``/``stack``, ``traceback.walk_stack``...);
- process-level actions (``gc`` walks, ``ctypes``, tracing, new audit hooks, subprocesses, signals to
  other processes, opening the tests' sources, the runner's files, ``/proc/<self>``, raw descriptors,
  writing ``conftest.py``/pytest configuration/start-up files in or above the workspace) count against
  the nearest workspace, test or runner frame, seen through stdlib and third-party frames;
- at every import, ``sys.meta_path`` and ``sys.path_hooks`` must hold no finder whose code is workspace
  code.

**Trusted roots.** Code is trusted (stdlib or third-party) only when its code object's file is a real
file under a read-only root fixed at start-up (the interpreter's stdlib, the ``sys.path`` directories
outside the workspace: the environment) or a frozen stdlib module. Everything else is workspace code: a
file in ``/tmp`` or any directory put on ``sys.path`` at run time, an unknown ``<...>`` name (code
compiled from a string), and a *spoofed* name: a trusted file's name given to code that is not that
file's text (``compile`` of other text, an AST, ``code.replace``, ``marshal.loads`` of bytes not read
from a trusted ``.pyc``). So package code cannot launder a reach through a file it wrote.

When the culprit is workspace code outside the tests (and the capability is not one the parent allowed
for that file because the pristine package used it there), the guard writes one ``guard`` record and
ends the process at once with :data:`GUARD_EXIT`: the run fails closed. What the guard writes is not
trusted (a process can write anything); a forged guard record can only fail its own run.
"""

from __future__ import annotations

import functools
import os
import sys
import types

GUARD_EXIT = 86  # the exit status of a process the guard ended

FRAME_EVENTS = frozenset({"sys._getframe", "sys._current_frames"})
FRAME_ATTRS = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "__code__"})
CODE_EVENTS = frozenset({"code.__new__", "function.__new__"})
ACTION_EVENTS = {
    "gc.get_objects": "gc",
    "gc.get_referrers": "gc",
    "gc.get_referents": "gc",
    "sys.settrace": "tracing",
    "sys.setprofile": "tracing",
    "sys.addaudithook": "tracing",
    "sys.monitoring.register_callback": "tracing",
    "subprocess.Popen": "process",
    "os.system": "process",
    "os.exec": "process",
    "os.posix_spawn": "process",
    "os.spawn": "process",
    "os.fork": "process",
    "os.forkpty": "process",
    "pty.spawn": "process",
    "os.kill": "signal",
    "os.killpg": "signal",
    "signal.pthread_kill": "signal",
}
#: stdlib functions that hand a frame (or a walk over frames) back to their caller
FRAME_WRAPPERS = frozenset(
    {
        "currentframe",
        "stack",
        "trace",
        "getouterframes",
        "getinnerframes",
        "getframeinfo",
        "walk_stack",
        "walk_tb",
        "extract_stack",
        "format_stack",
        "print_stack",
        "extract",
        "_getframe",
    }
)
#: files pytest or the interpreter read as configuration or start-up code: never written by package code
CONFIG_NAMES = frozenset(
    {"conftest.py", "pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", "pytest.toml"}
    | {"sitecustomize.py", "usercustomize.py"}
)
RENAME_EVENTS = frozenset({"os.rename", "os.link", "os.symlink", "shutil.copyfile", "shutil.move"})
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
#: the methods through which an import hook acts (a finder's class is judged by their code's files)
FINDER_METHODS = (
    "find_spec",
    "find_module",
    "__call__",
    "__init__",
    "__new__",
    "exec_module",
    "create_module",
    "load_module",
    "get_code",
    "get_data",
    "get_source",
    "source_to_code",
)
WRAPPERS = (
    (classmethod, "__func__"),
    (staticmethod, "__func__"),
    (property, "fget"),
    (types.MethodType, "__func__"),
    (functools.partial, "func"),
)
_mro = type.__dict__["__mro__"].__get__
_cls_dict = type.__dict__["__dict__"].__get__
_GETSET = type(type.__dict__["__dict__"])


def trusted_roots(workspace: str, exclude: tuple[str, ...]) -> tuple[str, ...]:
    """The read-only roots code may be trusted from: the interpreter's stdlib and every ``sys.path``
    directory at start-up outside the workspace and ``exclude`` (the runner's channel). In the sandbox
    these are the environment's and the interpreter's, bound read-only; ``/tmp``, ``HOME`` and the
    workspace are writable and never a root."""
    ws = os.path.realpath(workspace).rstrip("/") + "/"
    bad = tuple(os.path.realpath(e).rstrip("/") + "/" for e in exclude)
    roots = [os.path.dirname(os.path.realpath(os.__file__))]
    for p in sys.path:
        real = os.path.realpath(p or ".").rstrip("/") + "/"
        if os.path.isdir(real) and _root_ok(real, ws, bad):
            roots.append(real)
    return tuple(dict.fromkeys(r.rstrip("/") + "/" for r in roots))


def _root_ok(real: str, ws: str, bad: tuple[str, ...]) -> bool:
    """Not inside the workspace or the channel, and holding none of them nor a writable scratch place
    (``/tmp`` itself is never a root; a read-only environment bound below it may be)."""
    scratch = ("/tmp", "/var/tmp", "/dev/shm", os.path.expanduser("~"))
    held = (ws, *bad, *(os.path.realpath(d).rstrip("/") + "/" for d in scratch))
    return not real.startswith((ws, *bad)) and not any(d.startswith(real) for d in held)


def classify_factory(
    workspace: str,
    test_paths: tuple[str, ...],
    runner_files: frozenset[str],
    stdlib: str,
    roots: tuple[str, ...] | None = None,
):
    """A function ``filename -> kind`` (``runner``, ``test``, ``workspace``, ``stdlib``, ``other``) and
    the set of spoofed filenames it answers ``workspace`` for.

    With ``roots`` (the trusted-roots rule), code is trusted only from a real file under a root or from
    a frozen stdlib module: a file anywhere else (``/tmp``, a directory put on ``sys.path`` at run time),
    an unknown ``<...>`` name (code compiled from a string) and a spoofed filename are workspace code.
    ``roots=None`` is the old rule (any file outside the workspace is harmless), kept for the mutation test.
    """
    import _imp

    ws = workspace.rstrip("/") + "/"
    tests = tuple(os.path.join(workspace, t).rstrip("/") for t in test_paths)
    std = stdlib.rstrip("/") + "/"
    cache: dict[str, str] = {}
    spoofed: set[str] = set()
    isfile, realpath = os.path.isfile, os.path.realpath

    def is_test(real: str) -> bool:
        rel = real[len(ws) :]
        parts = rel.split("/")
        name = parts[-1]
        if any(real == t or real.startswith(t + "/") for t in tests):
            return True
        if name == "conftest.py" or (name.startswith("test_") and name.endswith(".py")):
            return True
        return name.endswith("_test.py") or any(p in ("tests", "test") for p in parts[:-1])

    def frozen(name: str) -> bool:
        mod = name[len("<frozen ") : -1] if name.startswith("<frozen ") and name.endswith(">") else ""
        return bool(mod) and (mod.startswith("importlib._bootstrap") or _imp.is_frozen(mod))

    def classify(filename: str) -> str:
        if filename in spoofed:
            return "workspace"
        kind = cache.get(filename)
        if kind is not None:
            return kind
        if not isinstance(filename, str):
            return "workspace"
        if filename.startswith("<"):
            if roots is None:
                kind = "stdlib" if filename.startswith("<frozen") else "dynamic"
            else:
                kind = "stdlib" if frozen(filename) else "workspace"
        else:
            real = realpath(filename)
            if real in runner_files:
                kind = "runner"
            elif real.startswith(ws):
                kind = "test" if is_test(real) else "workspace"
            elif roots is not None and not (isfile(real) and real.startswith(roots)):
                kind = "workspace"  # not a real file under a read-only trusted root
            elif real.startswith(std) and "-packages/" not in real:
                kind = "stdlib"
            else:
                kind = "other"
        cache[filename] = kind
        return kind

    def spoof(filename: str) -> None:
        if classify(filename) != "workspace":
            spoofed.add(filename)

    classify.spoof = spoof
    return classify


def code_files(obj, depth: int = 0):
    """The files of the Python code behind ``obj`` (a finder, a path hook, a loader), read without
    running any of its code: attributes are looked up in the class dictionaries, never through
    ``getattr`` (a property or ``__getattr__`` would run inside the hook, unguarded)."""
    t = type(obj)
    if depth > 3:
        return
    if t is types.FunctionType:
        yield types.FunctionType.__dict__["__code__"].__get__(obj).co_filename
        return
    for wrapper, attr in WRAPPERS:
        if t is wrapper:
            yield from code_files(wrapper.__dict__[attr].__get__(obj), depth + 1)
            return
    klasses = _mro(obj) if issubclass(t, type) else _mro(t)
    for klass in klasses:
        if klass is object or klass is type:
            continue
        d = _cls_dict(klass)
        for name in FINDER_METHODS:
            if name in d:
                yield from code_files(d[name], depth + 1)
    if not issubclass(t, type):
        slot = next((_cls_dict(k).get("__dict__") for k in _mro(t) if "__dict__" in _cls_dict(k)), None)
        if type(slot) is _GETSET:
            inst = slot.__get__(obj)
            for name in FINDER_METHODS:
                if type(inst) is dict and name in inst:
                    yield from code_files(inst[name], depth + 1)


def install(
    *,
    workspace: str,
    test_paths: tuple[str, ...],
    runner_files: frozenset[str],
    protected_dirs: tuple[str, ...],
    allow: dict[str, frozenset[str]],
    emit,
    trusted: bool = True,
) -> None:
    """Add the audit hook (see module docstring). ``allow`` maps a workspace file's real path to the
    capability kinds the parent allowed in it; ``emit`` writes one record to the result channel;
    ``trusted`` is the trusted-roots rule (off only for its mutation test)."""
    import marshal
    import threading

    roots = trusted_roots(workspace, protected_dirs) if trusted else None
    stdlib = os.path.dirname(os.path.realpath(os.__file__))
    classify = classify_factory(workspace, test_paths, runner_files, stdlib, roots)
    getframe, get_ident, exit_now, realpath = sys._getframe, threading.get_ident, os._exit, os.path.realpath
    loads, isfile = marshal.loads, os.path.isfile
    pid = str(os.getpid())
    proc_dirs = ("/proc/self/", "/proc/thread-self/", f"/proc/{pid}/")
    protected = tuple(d.rstrip("/") + "/" for d in protected_dirs)
    allow = {k: frozenset(v) for k, v in allow.items()}
    busy: set[int] = set()
    safe_finders: dict[int, object] = {}  # id -> the finder, kept alive so no id is reused
    ws = workspace.rstrip("/") + "/"
    transparent = ("stdlib", "other") if trusted else ("stdlib", "other", "dynamic")

    def protected_path(path) -> bool:
        if isinstance(path, int):
            return path > 2  # a raw descriptor the workspace did not open by name (the channel)
        if isinstance(path, bytes):
            path = path.decode("utf-8", "replace")
        if not isinstance(path, str):
            return False
        if path.startswith(proc_dirs):
            return True
        real = realpath(path)
        if real.startswith(proc_dirs) or real.startswith(protected) or real in runner_files:
            return True
        if real.startswith(ws) and real.endswith((".py", ".pyc")):
            return classify(real) == "test"
        return False

    def config_path(path) -> bool:
        """A file pytest or the interpreter reads as configuration or start-up code, in the workspace or
        a directory above it (where pytest looks for ``conftest.py`` and its configuration)."""
        if isinstance(path, bytes):
            path = path.decode("utf-8", "replace")
        if not trusted or not isinstance(path, str):
            return False
        name, where = os.path.basename(path), os.path.dirname(realpath(path)).rstrip("/") + "/"
        return (name in CONFIG_NAMES or name.endswith(".pth")) and (
            ws.startswith(where) or where.startswith(ws)
        )

    def fail(kind: str, event: str, frame) -> None:
        where = f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "?"
        rel = where[len(ws) :] if where.startswith(ws) else where
        try:
            emit({"kind": "guard", "capability": kind, "event": event, "where": rel})
        finally:
            exit_now(GUARD_EXIT)

    def culprit_direct(frame):
        """The frame that asked for a frame or code object, through the stdlib wrappers that return one."""
        while frame is not None:
            what = classify(frame.f_code.co_filename)
            if what == "stdlib" and frame.f_code.co_name not in FRAME_WRAPPERS:
                return None
            if what not in ("stdlib", "dynamic"):
                return frame
            frame = frame.f_back
        return None

    def culprit_nearest(frame):
        """The nearest workspace, test or runner frame (stdlib and third-party frames are transparent)."""
        while frame is not None and classify(frame.f_code.co_filename) in transparent:
            frame = frame.f_back
        return frame

    def guilty(frame, kind: str) -> bool:
        if frame is None:
            return False
        name = frame.f_code.co_filename
        return classify(name) == "workspace" and kind not in allow.get(realpath(name), ())

    def old_finder_file(obj) -> str:  # the rule before trusted roots (its mutation test)
        code = getattr(obj, "__code__", None)
        if code is not None:
            return code.co_filename
        mod = sys.modules.get(getattr(type(obj), "__module__", ""), None)
        return getattr(mod, "__file__", None) or "<frozen>"

    def check_finders(meta_path, path_hooks) -> str | None:
        """A finder whose code lives in the workspace (by its code's real files, never by ``__module__``)
        is evidence, unless that file may install import hooks (the pristine package does so there)."""
        for obj in (*meta_path, *path_hooks):
            if id(obj) in safe_finders:
                continue
            for name in code_files(obj) if trusted else (old_finder_file(obj),):
                what = classify(name)
                if what == "dynamic" or (
                    what == "workspace" and "import_hooks" not in allow.get(realpath(name), ())
                ):
                    return f"import hook {type(obj).__name__} from the workspace"
            safe_finders[id(obj)] = obj
        return None

    def same_as_file(filename: str, source) -> bool:
        """Whether code compiled under a trusted ``filename`` is that file's own text."""
        if not isinstance(source, (bytes, str)) or not isfile(filename):
            return False
        try:
            with open(filename, "rb") as fh:
                data = fh.read()
        except OSError:
            return False
        return data == (source.encode("utf-8") if isinstance(source, str) else source)

    def check_compile(args, frame) -> None:
        """Code compiled under the name of a trusted file must be that file's text; an AST (no name is
        reported) only by pytest's assertion rewriter or code the parent allowed ``code``."""
        source, filename = args[0], args[1] if len(args) > 1 else None
        if isinstance(filename, str):
            if classify(filename) != "workspace" and not same_as_file(filename, source):
                classify.spoof(filename)
            return
        if not isinstance(source, (bytes, str)):
            caller = frame.f_code.co_filename
            if classify(caller) in ("stdlib", "other") and "/_pytest/" in realpath(caller):
                return
            culprit = culprit_nearest(frame)
            if guilty(culprit, "code"):
                fail("code", "compile of an AST", culprit)

    def check_marshal(data, frame) -> None:
        """Bytecode loaded from a file under a trusted root is trusted; any other (a ``.pyc`` in
        ``/tmp``, ``marshal.loads`` of bytes) cannot claim a trusted file's name."""
        if frame.f_code.co_name == "_compile_bytecode" and classify(frame.f_code.co_filename) == "stdlib":
            path = frame.f_locals.get("bytecode_path")
            if isinstance(path, str) and classify(path) in ("stdlib", "other"):
                try:
                    with open(path, "rb") as fh:
                        if fh.read()[16:] == data:
                            return
                except OSError:
                    pass
        try:
            code = loads(data)
        except Exception:
            return
        todo = [code]
        while todo:
            c = todo.pop()
            if hasattr(c, "co_filename"):
                classify.spoof(c.co_filename)
                todo.extend(k for k in c.co_consts if hasattr(k, "co_filename"))

    def hook(event: str, args: tuple) -> None:
        tid = get_ident()
        if tid in busy:
            return
        busy.add(tid)
        try:
            dispatch(event, args)
        finally:
            busy.discard(tid)

    def dispatch(event: str, args: tuple) -> None:
        if event in FRAME_EVENTS:
            frame = culprit_direct(getframe(2))
            if guilty(frame, "frames"):
                fail("frames", event, frame)
        elif event == "object.__getattr__":
            if len(args) > 1 and args[1] in FRAME_ATTRS:
                kind = "code" if args[1] == "__code__" else "frames"
                frame = getframe(2)
                if guilty(frame, kind):
                    fail(kind, f"{event} {args[1]}", frame)
        elif event == "object.__setattr__":
            if len(args) > 1 and args[1] in ("__code__", "__globals__", "__closure__"):
                frame = getframe(2)
                if guilty(frame, "code"):
                    fail("code", f"{event} {args[1]}", frame)
        elif event == "compile":
            frame = getframe(2)
            if classify(frame.f_code.co_filename) == "workspace" and guilty(frame, "code"):
                fail("code", event, frame)
            if trusted:
                check_compile(args, frame)
        elif event == "marshal.loads" and trusted:
            check_marshal(args[0], getframe(2))
        elif event in CODE_EVENTS:
            frame = culprit_direct(getframe(2))
            if guilty(frame, "code"):
                fail("code", event, frame)
            if trusted and event == "code.__new__" and len(args) > 1 and isinstance(args[1], str):
                near = culprit_nearest(getframe(2))
                if near is not None and classify(near.f_code.co_filename) != "runner":
                    classify.spoof(args[1])  # a code object made by the test process's code
        elif event == "import":
            evidence = check_finders(args[3] or (), args[4] or ())
            if evidence is not None:
                fail("import_hooks", evidence, culprit_nearest(getframe(2)))
        elif event == "open":
            frame = culprit_nearest(getframe(2))
            if guilty(frame, "files") and protected_path(args[0]):
                fail("files", f"open {args[0]!r}", frame)
            flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
            if flags & WRITE_FLAGS and config_path(args[0]) and guilty(frame, "files"):
                fail("files", f"writes {args[0]!r}", frame)
        elif event in RENAME_EVENTS:
            frame = culprit_nearest(getframe(2))
            if len(args) > 1 and config_path(args[1]) and guilty(frame, "files"):
                fail("files", f"{event} to {args[1]!r}", frame)
        elif event.startswith("ctypes."):
            frame = culprit_nearest(getframe(2))
            if guilty(frame, "ctypes"):
                fail("ctypes", event, frame)
        else:
            kind = ACTION_EVENTS.get(event)
            if kind is None:
                return
            if kind == "signal" and args and str(args[0]) == pid:
                return  # a signal to itself can only end (and so fail) its own run
            frame = culprit_nearest(getframe(2))
            if guilty(frame, kind):
                fail(kind, event, frame)

    sys.addaudithook(hook)
