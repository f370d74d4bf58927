"""The guard's tables and its classifier of code by file (:mod:`guard`): stdlib only, copied into the
run's channel beside the guard and loaded by it by file path (nothing of the runner is importable by
name). See :mod:`guard` for the trusted-roots rule these functions implement."""

from __future__ import annotations

import functools
import os
import sys
import types

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
    {
        "conftest.py",
        "pytest.ini",
        ".pytest.ini",
        "tox.ini",
        "setup.cfg",
        "pyproject.toml",
        "pytest.toml",
    }
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


def writable_places(workspace: str, exclude: tuple[str, ...]) -> tuple[str, ...]:
    """The directories code may be written to during a run: the workspace, the channel (``exclude``)
    and the scratch places (``/tmp``, ``/var/tmp``, ``/dev/shm``, ``HOME``), each real, ending in ``/``."""
    scratch = ("/tmp", "/var/tmp", "/dev/shm", os.path.expanduser("~"))
    return tuple(os.path.realpath(d).rstrip("/") + "/" for d in (workspace, *exclude, *scratch))


def _root_ok(real: str, ws: str, bad: tuple[str, ...]) -> bool:
    """Not inside the workspace or the channel, and holding none of them nor a writable scratch place
    (``/tmp`` itself is never a root; a read-only environment bound below it may be)."""
    held = writable_places(ws, bad)
    return not real.startswith((ws, *bad)) and not any(d.startswith(real) for d in held)


def classify_factory(
    workspace: str,
    test_paths: tuple[str, ...],
    runner_files: frozenset[str],
    stdlib: str,
    roots: tuple[str, ...] | None = None,
    writable: tuple[str, ...] = (),
):
    """A function ``filename -> kind`` (``runner``, ``test``, ``workspace``, ``stdlib``, ``other``) and
    the set of spoofed filenames it answers ``workspace`` for.

    With ``roots`` (the trusted-roots rule), code is trusted only from a real file under a root or from
    a frozen stdlib module (a file reached through a link in a root counts when its target lies in none
    of the ``writable`` places or is read-only there: environments link their packages, e.g. a base env
    shared by symlinks, and the sandbox binds them read-only):
    a file anywhere else (``/tmp``, a directory put on ``sys.path`` at run time),
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
    access, dirname, W_OK = os.access, os.path.dirname, os.W_OK

    def is_test(real: str) -> bool:
        rel = real[len(ws) :]
        parts = rel.split("/")
        name = parts[-1]
        if any(real == t or real.startswith(t + "/") for t in tests):
            return True
        if name == "conftest.py" or (name.startswith("test_") and name.endswith(".py")):
            return True
        return name.endswith("_test.py") or any(p in ("tests", "test") for p in parts[:-1])

    def trusted_file(filename: str, real: str) -> bool:
        if real.startswith(roots):
            return True
        reached = os.path.normpath(filename) if filename.startswith("/") else ""
        if not reached or not reached.startswith(roots):
            return False
        # a target under a writable place counts only if it really is read-only here (the sandbox binds
        # environments read-only, also below /tmp: access() then fails with EROFS)
        return not real.startswith(writable) or not (access(real, W_OK) or access(dirname(real), W_OK))

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
            elif roots is not None and not (isfile(real) and trusted_file(filename, real)):
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
        slot = next(
            (_cls_dict(k).get("__dict__") for k in _mro(t) if "__dict__" in _cls_dict(k)),
            None,
        )
        if type(slot) is _GETSET:
            inst = slot.__get__(obj)
            for name in FINDER_METHODS:
                if type(inst) is dict and name in inst:
                    yield from code_files(inst[name], depth + 1)
