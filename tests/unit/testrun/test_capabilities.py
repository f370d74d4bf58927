"""The capability analyser: names resolved through aliases, re-exports and ``getattr``; computed names
count; source decoded with its declared encoding; a use the pristine file or package already makes is
no finding; ordinary code (value classes, helpers, dispatch by prefix, decorators) has none."""

from __future__ import annotations

import pytest

from cadenza.testrun.capabilities import MAX_SOURCE_BYTES, kinds, new_capabilities, scan

CASES = {
    "frame_read": ("import sys\n\ndef f():\n    return sys._getframe(1).f_locals\n", "frames"),
    "aliased_module": ("import sys as s\ng = s._getframe\n", "frames"),
    "aliased_function": ("from sys import _getframe as gf\nx = gf\n", "frames"),
    "assigned_alias": ("import inspect\ncf = inspect.currentframe\nF = cf()\n", "frames"),
    "getattr_constant": ("import sys\ng = getattr(sys, '_getframe')\n", "frames"),
    "getattr_computed_on_module": ("import sys\ng = getattr(sys, '_get' + 'frame')\n", "reflection"),
    "re_exported_sys": ("import os\nM = os.sys.modules\n", "modules"),
    "computed_modules_key": ("import sys\nsys.modules['py' + 'test'].skip('x')\n", "modules"),
    "vars_of_module": ("import sys\nM = vars(sys)['modules']\n", "reflection"),
    "dunder_assigned": (
        "class A:\n    pass\n\ndef yes(a, b):\n    return True\n\nA.__eq__ = yes\n",
        "foreign_patch",
    ),
    "setattr_dunder": ("class A:\n    pass\n\nsetattr(A, '__eq__', lambda a, b: True)\n", "foreign_patch"),
    "patch_foreign_module": ("import json\njson.dumps = str\n", "foreign_patch"),
    "atexit_exit": ("import atexit, os\natexit.register(os._exit, 0)\n", "exit"),
    "gc": ("import gc\nO = gc.get_objects()\n", "gc"),
    "ctypes": ("import ctypes\n", "ctypes"),
    "meta_path": ("import sys\nsys.meta_path.insert(0, object())\n", "import_hooks"),
    "computed_import": ("import importlib\nm = importlib.import_module(NAME)\n", "import_hooks"),
    "dunder_import": ("m = __import__('s' + 'ys')\n", "import_hooks"),
    "builtins": ("import builtins\nbuiltins.len = lambda x: 0\n", "builtins"),
    "raw_fd": ("import os\nos.write(7, b'x')\n", "raw_fd"),
    "code_object": ("def f():\n    pass\n\nf.__code__ = compile('1', 'x', 'eval')\n", "code"),
    "closure": ("def f(g):\n    return g.__closure__[0].cell_contents\n", "code"),
    "subclasses": ("S = object.__subclasses__()\n", "reflection"),
    "runner": ("import _pytest.runner\n", "runner"),
    "hook_in_source": ("def pytest_runtest_makereport(item, call):\n    pass\n", "runner"),
    "private_sys": ("import sys\nB = sys._cadenza_boot\n", "internals"),
    "utf7": ("# -*- coding: utf-7 -*-\nx = 1\n", "encoding"),
    # code loaded from outside the workspace (a file package code wrote, e.g. in /tmp)
    "runpy": ("import runpy\nG = runpy.run_path('/tmp/h.py')\n", "import_hooks"),
    "from_runpy": ("from runpy import run_path as rp\nG = rp('/tmp/h.py')\n", "import_hooks"),
    "sys_path_insert": ("import sys\nsys.path.insert(0, '/tmp')\n", "import_hooks"),
    "sys_path_alias": ("import sys\np = sys.path\np.append('/tmp')\n", "import_hooks"),
    "sys_path_slice": ("import sys\nsys.path[:0] = ['/tmp']\n", "import_hooks"),
    "spec_from_file": (
        "import importlib.util as u\ns = u.spec_from_file_location('h', '/tmp/h.py')\n",
        "import_hooks",
    ),
    "module_from_spec": (
        "from importlib.util import module_from_spec\nm = module_from_spec(S)\n",
        "import_hooks",
    ),
    "compile_with_a_file_name": ("c = compile(SRC, '/usr/lib/python3/json/x.py', 'exec')\n", "code"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_capability_is_found_through_aliases_and_computed_names(name: str):
    source, kind = CASES[name]
    assert kind in {u.kind for u in scan(source.encode())}, scan(source.encode())


ORDINARY = [
    "class V:\n    def __init__(self, x):\n        self.x = x\n\n    def __eq__(self, o):\n"
    "        return isinstance(o, V) and o.x == self.x\n\n"
    "    def __hash__(self):\n        return hash(self.x)\n",
    "from .core import thing\n\n\ndef helper(xs):\n    return [thing(x) for x in xs]\n",
    "def visit(self, node):\n    return getattr(self, f'visit_{type(node).__name__}')(node)\n",
    "import functools\n\ndef deco(f):\n    @functools.wraps(f)\n    def w(*a):\n        return f(*a)\n"
    "    w.__doc__ = f.__doc__\n    return w\n",
    "import os\nimport sys\n\nPATH = os.path.join(os.getcwd(), 'x')\n"
    "if sys.version_info >= (3, 11):\n    X = 1\n",
    "# -*- coding: utf-8 -*-\n'''Docs: café.'''\n",
    "import logging\nlog = logging.getLogger(__name__)\nlog.setLevel(logging.INFO)\n",
    "import sys\n\nFOUND = [p for p in sys.path if p.endswith('site-packages')]\n",  # reading sys.path
    "import importlib.util\n\nHAS_NUMPY = importlib.util.find_spec('numpy') is not None\n",
]


@pytest.mark.parametrize("source", ORDINARY)
def test_ordinary_code_has_no_capability(source: str):
    assert scan(source.encode()) == []


def test_a_use_the_pristine_file_or_package_makes_is_no_finding():
    frames = CASES["frame_read"][0].encode()
    assert new_capabilities({"p/a.py": frames}, {}, frozenset()) != []
    assert new_capabilities({"p/a.py": frames}, {"p/a.py": frames}, frozenset()) == []
    assert new_capabilities({"p/new.py": frames}, {}, kinds(frames)) == []
    utf7 = CASES["utf7"][0].encode()  # an encoding is excused by its own file only
    assert [f.kind for f in new_capabilities({"p/b.py": utf7}, {}, frozenset({"encoding"}))] == ["encoding"]


@pytest.mark.parametrize(
    "data,what",
    [
        (b"\xff\xfe\x00 binary", "encoding declaration"),
        (b"x = 1\ny = 2\nz = '\xff\xfe'\n", "does not decode"),
        (b"def f(:\n", "does not parse"),
        (b"x = 1\n" * (MAX_SOURCE_BYTES // 6 + 1), "limit"),
    ],
    ids=["binary", "mis_encoded", "syntax_error", "huge"],
)
def test_unreadable_source_is_a_finding_that_nothing_excuses(data: bytes, what: str):
    uses = scan(data)
    assert [u.kind for u in uses] == ["unreadable"] and what in uses[0].what
    assert new_capabilities({"p/a.py": data}, {"p/a.py": data}, frozenset({"unreadable"}))
