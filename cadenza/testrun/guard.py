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
outside the workspace: the environment) or a frozen stdlib module; a file reached through a link in a
root (an environment that links its packages from a shared base) counts when the link's target lies in
no place writable during the run (workspace, channel, ``/tmp``, ``HOME``) or is read-only there (a
venv bound read-only below ``/tmp``). Everything else is workspace
code: a file in ``/tmp`` or any directory put on ``sys.path`` at run time, an unknown ``<...>`` name (code
compiled from a string), and a *spoofed* name: a trusted file's name given to code that is not that
file's text (``compile`` of other text, an AST, ``code.replace``, ``marshal.loads`` of bytes not read
from a trusted ``.pyc``). So package code cannot launder a reach through a file it wrote.

When the culprit is workspace code outside the tests (and the capability is not one the parent allowed
for that file because the pristine package used it there), the guard writes one ``guard`` record and
ends the process at once with :data:`GUARD_EXIT`: the run fails closed. What the guard writes is not
trusted (a process can write anything); a forged guard record can only fail its own run.
"""

from __future__ import annotations

import importlib.util
import os
import sys

GUARD_EXIT = 86  # the exit status of a process the guard ended


def _load_rules():
    """:mod:`guard_rules`, from the file beside this one, by path (as the runner loads this file)."""
    path = os.path.join(os.path.dirname(os.path.realpath(__file__)), "guard_rules.py")
    spec = importlib.util.spec_from_file_location(f"{__name__}_rules", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_R = _load_rules()
RULES_FILE = os.path.realpath(_R.__file__)
ACTION_EVENTS, CODE_EVENTS, CONFIG_NAMES = (
    _R.ACTION_EVENTS,
    _R.CODE_EVENTS,
    _R.CONFIG_NAMES,
)
FRAME_ATTRS, FRAME_EVENTS, FRAME_WRAPPERS = (
    _R.FRAME_ATTRS,
    _R.FRAME_EVENTS,
    _R.FRAME_WRAPPERS,
)
RENAME_EVENTS, WRITE_FLAGS = _R.RENAME_EVENTS, _R.WRITE_FLAGS
classify_factory, code_files, trusted_roots, writable_places = (
    _R.classify_factory,
    _R.code_files,
    _R.trusted_roots,
    _R.writable_places,
)


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

    runner_files = runner_files | {RULES_FILE}
    roots = trusted_roots(workspace, protected_dirs) if trusted else None
    stdlib = os.path.dirname(os.path.realpath(os.__file__))
    writable = writable_places(workspace, protected_dirs)
    classify = classify_factory(workspace, test_paths, runner_files, stdlib, roots, writable)
    getframe, get_ident, exit_now, realpath = (
        sys._getframe,
        threading.get_ident,
        os._exit,
        os.path.realpath,
    )
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
        name, where = (
            os.path.basename(path),
            os.path.dirname(realpath(path)).rstrip("/") + "/",
        )
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

    def old_finder_file(
        obj,
    ) -> str:  # the rule before trusted roots (its mutation test)
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
