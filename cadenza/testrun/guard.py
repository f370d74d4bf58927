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
  other processes, opening the tests' sources, the runner's files, ``/proc/<self>``, raw descriptors)
  count against the nearest workspace, test or runner frame, seen through stdlib and third-party frames;
- at every import, ``sys.meta_path`` and ``sys.path_hooks`` must hold no finder defined in the workspace.

When the culprit is workspace code outside the tests (and the capability is not one the parent allowed
for that file because the pristine package used it there), the guard writes one ``guard`` record and
ends the process at once with :data:`GUARD_EXIT`: the run fails closed. What the guard writes is not
trusted (a process can write anything); a forged guard record can only fail its own run.
"""

from __future__ import annotations

import os
import sys

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
TEST_PATTERNS = ("test_", "conftest.py")


def classify_factory(workspace: str, test_paths: tuple[str, ...], runner_files: frozenset[str], stdlib: str):
    """A function ``filename -> kind`` (``runner``, ``test``, ``workspace``, ``stdlib``, ``other``)."""
    ws = workspace.rstrip("/") + "/"
    tests = tuple(os.path.join(workspace, t).rstrip("/") for t in test_paths)
    std = stdlib.rstrip("/") + "/"
    cache: dict[str, str] = {}

    def is_test(real: str) -> bool:
        rel = real[len(ws) :]
        parts = rel.split("/")
        name = parts[-1]
        if any(real == t or real.startswith(t + "/") for t in tests):
            return True
        if name == "conftest.py" or (name.startswith("test_") and name.endswith(".py")):
            return True
        return name.endswith("_test.py") or any(p in ("tests", "test") for p in parts[:-1])

    def classify(filename: str) -> str:
        kind = cache.get(filename)
        if kind is not None:
            return kind
        if filename.startswith("<"):
            kind = "stdlib" if filename.startswith("<frozen") else "dynamic"
        else:
            real = os.path.realpath(filename)
            if real in runner_files:
                kind = "runner"
            elif real.startswith(ws):
                kind = "test" if is_test(real) else "workspace"
            elif real.startswith(std) and "-packages/" not in real:
                kind = "stdlib"
            else:
                kind = "other"
        cache[filename] = kind
        return kind

    return classify


def install(
    *,
    workspace: str,
    test_paths: tuple[str, ...],
    runner_files: frozenset[str],
    protected_dirs: tuple[str, ...],
    allow: dict[str, frozenset[str]],
    emit,
) -> None:
    """Add the audit hook (see module docstring). ``allow`` maps a workspace file's real path to the
    capability kinds the parent allowed in it; ``emit`` writes one record to the result channel."""
    import threading

    classify = classify_factory(workspace, test_paths, runner_files, os.path.dirname(os.__file__))
    getframe, get_ident, exit_now, realpath = sys._getframe, threading.get_ident, os._exit, os.path.realpath
    pid = str(os.getpid())
    proc_dirs = ("/proc/self/", "/proc/thread-self/", f"/proc/{pid}/")
    protected = tuple(d.rstrip("/") + "/" for d in protected_dirs)
    allow = {k: frozenset(v) for k, v in allow.items()}
    busy: set[int] = set()
    safe_finders: dict[int, object] = {}  # id -> the finder, kept alive so no id is reused
    ws = workspace.rstrip("/") + "/"

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

    def fail(kind: str, event: str, frame) -> None:
        where = f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "?"
        rel = where[len(ws) :] if where.startswith(ws) else where
        try:
            emit({"kind": "guard", "capability": kind, "event": event, "where": rel})
        finally:
            exit_now(GUARD_EXIT)

    def culprit_direct(frame):
        """The frame that asked for a frame or code object, through the stdlib wrappers that return one
        and through code compiled from strings (whoever ran it answers for it)."""
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
        while frame is not None and classify(frame.f_code.co_filename) in ("stdlib", "other", "dynamic"):
            frame = frame.f_back
        return frame

    def guilty(frame, kind: str) -> bool:
        if frame is None:
            return False
        name = frame.f_code.co_filename
        return classify(name) == "workspace" and kind not in allow.get(realpath(name), ())

    def finder_file(obj) -> str:
        code = getattr(obj, "__code__", None)
        if code is not None:
            return code.co_filename
        mod = sys.modules.get(getattr(type(obj), "__module__", ""), None)
        return getattr(mod, "__file__", None) or "<frozen>"

    def check_finders(meta_path, path_hooks) -> str | None:
        """A finder defined in the workspace is evidence, unless its file may install import hooks (the
        pristine package does so there, e.g. a lazy-import shim)."""
        for obj in (*meta_path, *path_hooks):
            if id(obj) in safe_finders:
                continue
            name = finder_file(obj)
            what = classify(name)
            if what == "dynamic" or (
                what == "workspace" and "import_hooks" not in allow.get(realpath(name), ())
            ):
                return f"import hook {type(obj).__name__} from the workspace"
            safe_finders[id(obj)] = obj
        return None

    def hook(event: str, args: tuple) -> None:
        tid = get_ident()
        if tid in busy:
            return
        busy.add(tid)
        try:
            if event in FRAME_EVENTS:
                frame = culprit_direct(getframe(1))
                if guilty(frame, "frames"):
                    fail("frames", event, frame)
            elif event == "object.__getattr__":
                if len(args) > 1 and args[1] in FRAME_ATTRS:
                    kind = "code" if args[1] == "__code__" else "frames"
                    frame = getframe(1)
                    if guilty(frame, kind):
                        fail(kind, f"{event} {args[1]}", frame)
            elif event == "object.__setattr__":
                if len(args) > 1 and args[1] in ("__code__", "__globals__", "__closure__"):
                    frame = getframe(1)
                    if guilty(frame, "code"):
                        fail("code", f"{event} {args[1]}", frame)
            elif event == "compile":
                frame = getframe(1)
                if classify(frame.f_code.co_filename) == "workspace" and guilty(frame, "code"):
                    fail("code", event, frame)
            elif event in CODE_EVENTS:
                frame = culprit_direct(getframe(1))
                if guilty(frame, "code"):
                    fail("code", event, frame)
            elif event == "import":
                evidence = check_finders(args[3] or (), args[4] or ())
                if evidence is not None:
                    fail("import_hooks", evidence, culprit_nearest(getframe(1)))
            elif event == "open":
                frame = culprit_nearest(getframe(1))
                if guilty(frame, "files") and protected_path(args[0]):
                    fail("files", f"open {args[0]!r}", frame)
            elif event.startswith("ctypes."):
                frame = culprit_nearest(getframe(1))
                if guilty(frame, "ctypes"):
                    fail("ctypes", event, frame)
            else:
                kind = ACTION_EVENTS.get(event)
                if kind is None:
                    return
                if kind == "signal" and args and str(args[0]) == pid:
                    return  # a signal to itself can only end (and so fail) its own run
                frame = culprit_nearest(getframe(1))
                if guilty(frame, kind):
                    fail(kind, event, frame)
        finally:
            busy.discard(tid)

    sys.addaudithook(hook)
