"""The test process's first code: ``python BOOT.py CONFIG.json PYTEST-ARGS...`` (stdlib only).

The parent copies this file, :mod:`cadenza.testrun.guard` and :mod:`cadenza.testrun.plugin` into the
run's private channel directory and starts the interpreter on this file by path. Before any workspace
code can run it:

1. drops its own directory from ``sys.path`` (nothing of the runner is importable by name) and puts
   the working directory first, as ``python -m pytest`` does;
2. opens the result file once and builds the record writer (records are numbered, nothing more: no
   secret is kept in this process, since none could be hidden in it);
3. imports pytest, its built-in plugins and pluggy with the workspace's ``sys.path`` entries moved to
   the back, so a workspace module cannot stand in for any of them (``sys.path`` is restored after);
4. installs the guard (an audit hook that cannot be removed);
5. loads the plugin by file path under the per-run random name the parent chose, never through
   ``sys.path``, and hands it to ``pytest.main`` as an object.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import sys


def _writer(path: str):
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    dumps, write, seq = json.dumps, os.write, [0]

    def emit(rec: dict) -> None:
        write(fd, (dumps({"seq": seq[0], **rec}, sort_keys=True) + "\n").encode())
        seq[0] += 1

    return emit


def _load(name: str, path: str, inject: dict):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    mod.__dict__.update(inject)
    spec.loader.exec_module(mod)
    return mod


def _preimport(workspace: str, plugins: list[str]) -> list:
    """pytest, its default plugins, pluggy and the env's ``pytest11`` plugins, resolved with the
    workspace last on ``sys.path``; returns the plugin modules (registered by object, so ``-p NAME``
    finds them registered and imports nothing)."""
    loaded = []
    saved = list(sys.path)
    inside = [p for p in saved if os.path.realpath(p or ".").startswith(workspace)]
    sys.path[:] = [p for p in saved if p not in inside] + inside
    try:
        import _pytest.config
        import pluggy  # noqa: F401
        import pytest  # noqa: F401

        for name in _pytest.config.default_plugins:
            if name not in ("pytester", "legacypath"):
                with contextlib.suppress(ImportError):  # an optional dependency of a built-in plugin
                    importlib.import_module(f"_pytest.{name}")
        for name in plugins:
            with contextlib.suppress(Exception):  # a broken plugin fails as it would under pytest
                loaded.append(importlib.import_module(name))
    finally:
        sys.path[:] = saved
    return loaded


def main(argv: list[str]) -> int:
    here = os.path.dirname(os.path.realpath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != here]
    with open(argv[0]) as fh:
        config = json.load(fh)
    emit = _writer(config["results"])
    workspace = os.path.realpath(os.getcwd()) + os.sep
    env_plugins = _preimport(workspace, list(config.get("plugins") or []))
    sys.path.insert(0, workspace.rstrip(os.sep))  # what ``python -m pytest`` puts first: the cwd
    guard = _load(config["guard_name"], os.path.join(here, "guard.py"), {})
    runner_files = frozenset(os.path.join(here, f) for f in ("boot.py", "guard.py", "plugin.py"))
    g = config.get("guard") or {}
    if config.get("checks", {}).get("guard", True):
        guard.install(
            workspace=workspace.rstrip(os.sep),
            test_paths=tuple(g.get("test_paths") or ()),
            runner_files=runner_files,
            protected_dirs=(here,),
            allow={os.path.join(workspace, k): frozenset(v) for k, v in (g.get("allow") or {}).items()},
            emit=emit,
            trusted=config.get("checks", {}).get("trusted_roots", True),
        )
    import pytest

    if not config.get("checks", {}).get("by_path", True):  # the mutation test's old way: -p by name
        sys._cadenza_boot = (config, emit)
        sys.path.insert(1, here)
        return int(pytest.main(argv[1:]))
    plugin = _load(config["plugin_name"], os.path.join(here, "plugin.py"), {"_BOOT": (config, emit)})
    return int(pytest.main(argv[1:], plugins=[plugin, *env_plugins]))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
