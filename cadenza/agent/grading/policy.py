"""Which of an agent's changes count: source files only, never tests, test config or import hooks.

Each dropped change carries a reason so graders and the monitor can report it. The rules are about
*channels*, not examples: anything pytest reads as configuration, anything Python runs at start-up,
and any new top-level module that would shadow an importable one (``pytest.py``, ``json/``...).
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from cadenza.pathrel import is_within
from cadenza.tasks.records.task import Task
from cadenza.testrun import Checks

PYTEST_CONFIG_FILES = frozenset(
    {"pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini", "setup.cfg"}
)
STARTUP_HOOKS = frozenset({"sitecustomize.py", "usercustomize.py"})
TEST_DIR_NAMES = frozenset({"tests", "test"})
TEST_FILE_PATTERNS = ("test_*.py", "*_test.py", "tests.py", "conftest.py")
#: Packaging metadata: where ``importlib.metadata`` (and so pytest's plugin discovery) finds entry points.
METADATA_SUFFIXES = (".dist-info", ".egg-info", ".egg-link")
METADATA_FILES = frozenset({"entry_points.txt", "direct_url.json", "RECORD", "PKG-INFO"})


@dataclass(kw_only=True)
class Defences:
    """Grading defences, all on. Each can be switched off alone, only so that the mutation tests can show
    that an attack then succeeds (``tests/integration/agent/test_redteam_verdict.py``)."""

    drop_tests: bool = True  # changes to test files and conftest.py are not applied
    drop_pytest_config: bool = True  # pytest.ini, tox.ini, setup.cfg, [tool.pytest] in pyproject.toml
    drop_startup_hooks: bool = True  # sitecustomize.py, usercustomize.py, *.pth
    drop_packaging_metadata: bool = True  # *.dist-info/, *.egg-info/, entry_points.txt
    drop_shadow_modules: bool = True  # new top-level modules named like an importable one (pytest.py)
    drop_bytecode: bool = True  # __pycache__/ and *.pyc are never compared nor copied (grading.diff)
    autoload_off: bool = True  # PYTEST_DISABLE_PLUGIN_AUTOLOAD=1: entry-point plugins never load
    clear_addopts: bool = True  # -o addopts= before the task's own (neutralised) pytest_args
    drop_new_init_near_tests: bool = True  # a new __init__.py in a test directory or any directory above one
    capability_check: bool = True  # changed code may use no process-level capability the original never used
    f2p_rerun: bool = True  # the fail-to-pass tests run again alone, in a fresh process; outcomes must agree
    checks: Checks = field(default_factory=Checks)  # the result channel's checks


@dataclass(kw_only=True)
class GradePolicy:
    """``test_paths``: workspace-relative files/dirs that belong to the test suite (from the task)."""

    test_paths: frozenset[str]
    shadowable: frozenset[str]  # importable top-level names (stdlib + env)
    pristine_top: frozenset[str]  # top-level module names that exist in the pristine workspace
    pristine_files: frozenset[str] = frozenset()  # every file of the pristine workspace
    import_roots: tuple[str, ...] = ("", "src")
    defences: Defences = field(default_factory=Defences)

    @classmethod
    def for_task(
        cls,
        task: Task,
        *,
        shadowable: frozenset[str],
        pristine_top: frozenset[str],
        pristine_files: frozenset[str] = frozenset(),
        defences: Defences | None = None,
    ) -> GradePolicy:
        paths = {p.strip("/") for p in task.test_files}
        paths |= {
            nid.split("::", 1)[0] for nid in [*task.fail_to_pass, *task.pass_to_pass] if not is_doctest(nid)
        }
        return cls(
            test_paths=frozenset(p for p in paths if p),
            shadowable=shadowable,
            pristine_top=pristine_top,
            pristine_files=pristine_files,
            defences=defences or Defences(),
        )

    def reason_to_drop(self, rel: str, kind: str) -> str | None:
        """Why a change to ``rel`` is not applied for grading, or None when it is kept."""
        path = PurePosixPath(rel)
        name = path.name
        if kind == "link":
            return "symlink (only regular files are graded)"
        if kind == "other":
            return "not a regular file"
        d = self.defences
        if d.drop_tests and name == "conftest.py":
            return "conftest.py is test configuration"
        if d.drop_pytest_config and name in PYTEST_CONFIG_FILES:
            return "pytest configuration file"
        if d.drop_startup_hooks and name in STARTUP_HOOKS:
            return "interpreter start-up hook"
        if d.drop_startup_hooks and name.endswith(".pth"):
            return ".pth files run code at start-up"
        if d.drop_packaging_metadata and is_packaging_metadata(rel):
            return "packaging metadata (entry points) is never graded"
        if d.drop_tests and self.is_test(rel):
            return "test file"
        if d.drop_new_init_near_tests and name == "__init__.py" and self.beside_or_above_tests(rel):
            return "new __init__.py beside or above test files (it would run before the tests)"
        shadow = self.shadowed_module(path) if d.drop_shadow_modules else None
        if shadow is not None:
            return f"new module '{shadow}' would shadow an importable module"
        return None

    def is_test(self, rel: str) -> bool:
        path = PurePosixPath(rel)
        if any(is_within(rel, t) for t in self.test_paths):
            return True
        if any(fnmatch.fnmatch(path.name, pat) for pat in TEST_FILE_PATTERNS):
            return True
        return any(part in TEST_DIR_NAMES for part in path.parts[:-1])

    def beside_or_above_tests(self, rel: str) -> bool:
        """A new ``__init__.py`` in a directory that holds test files or is an ancestor of one: pytest
        imports such a package before the test module (rootdir/``__init__`` package detection)."""
        if rel in self.pristine_files:
            return False
        here = str(PurePosixPath(rel).parent)
        here = "" if here == "." else here
        dirs = {str(PurePosixPath(t).parent) if t.endswith(".py") else t for t in self.test_paths}
        dirs = {"" if d == "." else d for d in dirs}
        return any(here == "" or d == here or d.startswith(here + "/") for d in dirs)

    def shadowed_module(self, path: PurePosixPath) -> str | None:
        for root in self.import_roots:
            parts = path.parts
            if root:
                if parts[:1] != (root,):
                    continue
                parts = parts[1:]
            if not parts:
                continue
            top = parts[0]
            if len(parts) == 1:
                if not top.endswith((".py", ".so", ".pyd")):
                    continue
                top = top.split(".", 1)[0]
            if top in self.shadowable and top not in self.pristine_top:
                return top
        return None


def is_packaging_metadata(rel: str) -> bool:
    """Inside a ``*.dist-info``/``*.egg-info`` directory, or an entry-point/metadata file anywhere."""
    path = PurePosixPath(rel)
    return path.name in METADATA_FILES or any(p.endswith(METADATA_SUFFIXES) for p in path.parts)


def is_doctest(nodeid: str) -> bool:
    """``pkg/mod.py::pkg.mod.func`` is a doctest item: its file is source the agent may edit, not a test
    file."""
    _, sep, rest = nodeid.partition("::")
    return bool(sep) and "::" not in rest and "." in rest.split("[", 1)[0]


def top_level_modules(
    workspace: os.PathLike[str] | str, roots: tuple[str, ...] = ("", "src")
) -> frozenset[str]:
    names: set[str] = set()
    for root in roots:
        base = os.path.join(workspace, root)
        if not os.path.isdir(base):
            continue
        for entry in os.scandir(base):
            names.add(entry.name.split(".", 1)[0] if entry.is_file() else entry.name)
    return frozenset(names)
