"""The guard (a PEP 578 audit hook installed by the runner's boot file before any workspace code): real
pytest runs in which package code reaches for the process. Each reach ends the run, closed (every node
fails, the evidence names the capability and the line); the same code runs unhindered with the guard
switched off (so each case is a real reach, not a crash); ordinary stdlib use never trips it."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from cadenza.testrun import Checks, HostExecutor, env_plugins, run_tests

NODE = "tests/test_p.py::test_p"
TEST = "import pkg\n\n\ndef test_p():\n    assert pkg.VALUE == 1\n"


def _run(tmp_path: Path, pkg: str, *, guard: bool = True, allow=None):
    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True, exist_ok=True)
    (ws / "tests").mkdir(exist_ok=True)
    (ws / "pkg" / "__init__.py").write_text(textwrap.dedent(pkg) + "\nVALUE = 1\n")
    (ws / "tests" / "test_p.py").write_text(TEST)
    (ws / "tests" / "data.txt").write_text("fixture data\n")
    chan = tmp_path / f"chan-{guard}"
    return run_tests(
        python=sys.executable,
        workspace=ws,
        node_ids=[NODE],
        executor=HostExecutor(),
        channel_dir=chan,
        plugins=env_plugins(sys.path, [ws]),
        per_test_timeout_s=None,
        timeout_s=120,
        checks=Checks(guard=guard),
        allow=allow if allow is not None else {},  # nothing allowed (None: what the sources visibly use)
    )


REACHES = {
    "frame": ("import sys\n\ndef peek():\n    return sys._getframe(1).f_locals\n\npeek()\n", "frames"),
    "frame_via_inspect": ("import inspect\n\nF = inspect.currentframe().f_back\n", "frames"),
    "frame_via_traceback": (
        "try:\n    raise ValueError\nexcept ValueError as e:\n    F = e.__traceback__.tb_frame\n",
        "frames",
    ),
    "gc_walk": ("import gc\n\nOBJS = gc.get_referrers(gc)\n", "gc"),
    "ctypes": ("import ctypes\n\nctypes.CDLL(None)\n", "ctypes"),
    "tracing": ("import sys\n\nsys.settrace(lambda *a: None)\nsys.settrace(None)\n", "tracing"),
    "code_object": ("def f():\n    return 1\n\nf.__code__ = (lambda: 2).__code__\n", "code"),
    "exec_string": ("exec('import sys; sys._getframe(0)')\n", "code"),
    "subprocess": ("import subprocess\n\nsubprocess.run(['true'], check=False)\n", "process"),
    "reads_the_tests": ("import os\n\nSRC = open(os.path.join('tests', 'test_p.py')).read()\n", "files"),
    "raw_descriptor": ("import io\n\nio.FileIO(5, 'w', closefd=False)\n", "files"),
    # the trusted-roots rule: code laundered through a file in /tmp or a trusted file's name
    "frame_from_a_tmp_file": (
        "import os, runpy, tempfile\n\np = os.path.join(tempfile.mkdtemp(), 'h.py')\n"
        "open(p, 'w').write('import sys\\nF = sys._getframe(0)\\n')\nrunpy.run_path(p)\n",
        "frames",
    ),
    "frame_under_a_stdlib_name": (
        "import importlib.machinery as m, json\n\n"
        "src = 'import sys\\nF = sys._getframe(0)'\n"
        "c = m.SourceFileLoader('h', json.__file__).source_to_code(src, json.__file__)\n"
        "exec(c, {})\n",
        "frames",
    ),
    "finder_claiming_json": (
        "import sys\n\nclass F:\n    __module__ = 'json'\n\n"
        "    def find_spec(self, *a):\n        return None\n\n"
        "sys.meta_path.insert(0, F())\nimport json.tool\n",
        "import_hooks",
    ),
    "writes_a_conftest_above": (
        "import os\n\nopen(os.path.join(os.path.dirname(os.getcwd()), 'conftest.py'), 'w').close()\n",
        "files",
    ),
    "import_hook": (
        "import sys\n\nclass F:\n    def find_spec(self, *a):\n        return None\n\n"
        "sys.meta_path.insert(0, F())\nimport json.tool\n",
        "import_hooks",
    ),
}


@pytest.mark.parametrize("name", list(REACHES))
def test_a_reach_for_the_process_ends_the_run_closed(tmp_path: Path, name: str):
    code, kind = REACHES[name]
    rep = _run(tmp_path, code)
    assert rep.passing == set() and rep.statuses([NODE]) == {NODE: "tampered"}, rep.output_tail
    assert any(f"guard ended the test process: {kind}" in t for t in rep.tampering), rep.tampering
    elsewhere = kind == "import_hooks" or name in ("frame_from_a_tmp_file", "frame_under_a_stdlib_name")
    assert any("pkg/__init__.py:" in t for t in rep.tampering) or elsewhere, rep.tampering
    off = _run(tmp_path, code, guard=False)
    assert off.tampering == [] and off.passing == {NODE}, (off.tampering, off.output_tail)


def test_a_file_the_parent_allows_may_use_its_capability(tmp_path: Path):
    """``allow``: a capability the pristine file used (the parent decides from the source)."""
    code = REACHES["frame"][0]
    rep = _run(tmp_path, code, allow={"pkg/__init__.py": ["frames"]})
    assert rep.tampering == [] and rep.passing == {NODE}


ORDINARY = """
import collections, copy, dataclasses, enum, functools, json, logging, pickle, string, threading
import traceback, typing, warnings

P = collections.namedtuple("P", "a b")
class N(typing.NamedTuple):
    a: int
class E(enum.Enum):
    A = 1
F = enum.Enum("F", "X Y")
@dataclasses.dataclass
class D:
    x: int = 1
logging.getLogger("pkg").warning("hi")
warnings.warn("careful")
@functools.lru_cache
def g(x):
    return x
g(1)
copy.deepcopy(D())
pickle.loads(pickle.dumps(P(1, 2)))
t = threading.Thread(target=lambda: None)
t.start()
t.join()
string.Template("$a").substitute(a=1)
try:
    raise ValueError("x")
except ValueError:
    TB = traceback.format_exc()
DATA = open("tests/data.txt").read()
import os, tempfile
open(os.path.join(tempfile.mkdtemp(), "pyproject.toml"), "w").close()  # configuration, not above us
json.dumps({"a": 1})
"""


def test_ordinary_stdlib_use_never_trips_the_guard(tmp_path: Path):
    rep = _run(tmp_path, ORDINARY)
    assert rep.tampering == [] and rep.passing == {NODE}, (rep.tampering, rep.output_tail)


def test_a_linked_environment_is_trusted_unless_its_link_leads_to_a_writable_place(tmp_path: Path):
    """Environments may link their packages from a shared base (a light env, uv's symlink mode): a file
    reached through a link in a trusted root is trusted when its target is read-only during the run, and
    workspace code when the target lies in a writable place (so a planted link launders nothing)."""
    from cadenza.testrun.guard import classify_factory

    root, base, scratch, ws = (tmp_path / n for n in ("env", "base", "scratch", "ws"))
    for d in (root, base, scratch, ws):
        d.mkdir()
    (root / "own.py").write_text("A = 1\n")
    (base / "shared.py").write_text("B = 1\n")
    (scratch / "planted.py").write_text("C = 1\n")
    (root / "shared.py").symlink_to(base / "shared.py")
    (root / "planted.py").symlink_to(scratch / "planted.py")
    (root / "pkgdir").symlink_to(base, target_is_directory=True)
    classify = classify_factory(
        str(ws) + "/",
        ("tests",),
        frozenset(),
        "/nonexistent-stdlib",
        roots=(f"{root}/",),
        writable=(f"{ws}/", f"{scratch}/"),
    )
    kinds = {n: classify(str(root / n)) for n in ("own.py", "shared.py", "planted.py", "pkgdir/shared.py")}
    linked = {"own.py": "other", "shared.py": "other", "pkgdir/shared.py": "other"}
    assert kinds == {**linked, "planted.py": "workspace"}
    assert classify(str(scratch / "planted.py")) == "workspace"  # the target itself, named directly
    assert classify(str(root / "pkgdir" / ".." / ".." / "scratch" / "planted.py")) == "workspace"
