"""libcst deletions on a synthetic package: levels 1-3, formatting kept, imports fixed, gold patch exact."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cadenza.tasks.deletion.delete import DeletionError, apply_deletion, plan_deletion, removed_snippets
from cadenza.tasks.deletion.features import Candidate, module_files
from cadenza.tasks.deletion.statement import leaks, template_statement
from cadenza.tasks.sources.source import describe_source
from tests.support.tasks_helpers import CORE, INIT, make_repo


def _cand(qualname: str, kind: str, path: str = "minilib/core.py", module: str = "minilib.core") -> Candidate:
    local = qualname[len(module) + 1 :] if qualname != module else ""
    return Candidate(
        qualname=qualname,
        module=module,
        local=local,
        path=path,
        kind=kind,
        lineno=1,
        end_lineno=1,
        body_lines=1,
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo")


def _modules(root: Path) -> dict[str, str]:
    return module_files(describe_source(str(root), root))


def _imports(root: Path, stmt: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", stmt],
        cwd=root,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"},
    )


def _git_apply_restores(root: Path, deletion, tmp: Path) -> None:
    """Apply the deletion to a copy, then the gold patch with real `git apply`: the tree equals the
    original."""
    work = tmp / "work"
    shutil.copytree(root, work)
    apply_deletion(work, deletion)
    patch = tmp / "gold.patch"
    patch.write_text(deletion.gold_patch)
    proc = subprocess.run(["git", "apply", str(patch)], cwd=work, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    for p in root.rglob("*"):
        if p.is_file():
            assert (work / p.relative_to(root)).read_bytes() == p.read_bytes(), p
    assert sorted(x.relative_to(work) for x in work.rglob("*")) == sorted(
        x.relative_to(root) for x in root.rglob("*")
    )


def test_level1_stubs_body_keeps_signature_docstring_and_formatting(repo: Path, tmp_path: Path) -> None:
    d = plan_deletion(repo, _cand("minilib.core.add", "function"), 1, _modules(repo))
    new = d.changed["minilib/core.py"]
    assert '    """Return the sum of a and b."""\n    raise NotImplementedError\n' in new
    assert "total = a + b" not in new and "inline comment about totals" not in new
    # Everything outside the body is byte-identical.
    before, after = CORE.split("def add")[0], new.split("def add")[0]
    assert before == after and new.split("def mul")[1] == CORE.split("def mul")[1]
    assert "# A comment that must survive." in new
    assert list(d.changed) == ["minilib/core.py"]
    assert "total = a + b  # inline comment about totals" in d.removed_snippets
    assert not any(s.startswith("def add") for s in d.removed_snippets)  # the def line is still there
    _git_apply_restores(repo, d, tmp_path)


def test_level1_method_and_one_line_body(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "r")
    core = root / "minilib/core.py"
    core.write_text(core.read_text() + "\n\ndef one(x): return x * 41 + 1\n")
    d = plan_deletion(root, _cand("minilib.core.Stack.pop", "method"), 1, _modules(root))
    assert (
        '        """Pop the top item."""\n        raise NotImplementedError\n\n    def peek'
        in d.changed["minilib/core.py"]
    )
    d2 = plan_deletion(root, _cand("minilib.core.one", "function"), 1, _modules(root))
    assert d2.changed["minilib/core.py"].endswith("def one(x):\n    raise NotImplementedError\n")
    apply_deletion(root, d2)
    assert (
        _imports(
            root, "import minilib.core as c\ntry:\n    c.one(1)\nexcept NotImplementedError:\n    print('ok')"
        ).stdout
        == "ok\n"
    )


def test_level1_refuses_trivial_body(repo: Path) -> None:
    core = repo / "minilib/core.py"
    core.write_text(core.read_text() + '\n\ndef todo():\n    """Later."""\n    raise NotImplementedError\n')
    with pytest.raises(DeletionError):
        plan_deletion(repo, _cand("minilib.core.todo", "function"), 1, _modules(repo))


def test_level2_removes_function_alias_reexport_and_all_entry(repo: Path, tmp_path: Path) -> None:
    d = plan_deletion(repo, _cand("minilib.core.add", "function"), 2, _modules(repo))
    core, init = d.changed["minilib/core.py"], d.changed["minilib/__init__.py"]
    assert "def add" not in core and "plus = add" not in core
    assert "def mul" in core and "# A comment that must survive." not in core.split("def mul")[1]
    assert "from .core import mul, Stack" in init and '__all__ = ["mul", "Stack", "textutil"]' in init
    assert d.removed_names == {"minilib": ["add"], "minilib.core": ["add", "plus"]}
    work = tmp_path / "w"
    shutil.copytree(repo, work)
    apply_deletion(work, d)
    proc = _imports(
        work, "import minilib, minilib.core; print(hasattr(minilib, 'add'), minilib.mul.__name__)"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False mul"
    assert any(s.startswith("def add(a, b):") for s in d.removed_snippets)
    assert "Return the sum of a and b." in d.removed_snippets
    _git_apply_restores(repo, d, tmp_path / "g")


def test_level2_method_drops_class_alias(repo: Path, tmp_path: Path) -> None:
    d = plan_deletion(repo, _cand("minilib.core.Stack.peek", "method"), 2, _modules(repo))
    core = d.changed["minilib/core.py"]
    assert "def peek" not in core and "top = peek" not in core and "def pop" in core
    work = tmp_path / "w"
    shutil.copytree(repo, work)
    apply_deletion(work, d)
    assert _imports(work, "import minilib").returncode == 0
    _git_apply_restores(repo, d, tmp_path / "g")


def test_level3_class_and_module(repo: Path, tmp_path: Path) -> None:
    mods = _modules(repo)
    d = plan_deletion(repo, _cand("minilib.core.Stack", "class"), 3, mods)
    assert "class Stack" not in d.changed["minilib/core.py"]
    assert "from .core import add, mul\n" in d.changed["minilib/__init__.py"]
    assert any("def push(self, item):" in a for a in d.api)
    work = tmp_path / "w"
    shutil.copytree(repo, work)
    apply_deletion(work, d)
    assert _imports(work, "import minilib").returncode == 0

    m = plan_deletion(
        repo, _cand("minilib.textutil", "module", "minilib/textutil.py", "minilib.textutil"), 3, mods
    )
    assert m.changed["minilib/textutil.py"] is None
    init = m.changed["minilib/__init__.py"]
    assert "textutil" not in init and init.startswith(INIT.split("from . import")[0])
    assert "new file mode 100644" in m.gold_patch and "+++ b/minilib/textutil.py" in m.gold_patch
    work2 = tmp_path / "w2"
    shutil.copytree(repo, work2)
    apply_deletion(work2, m)
    assert not (work2 / "minilib/textutil.py").exists()
    proc = _imports(work2, "import minilib; print(sorted(minilib.__all__))")
    assert proc.returncode == 0 and proc.stdout.strip() == "['Stack', 'add', 'mul']"
    _git_apply_restores(repo, m, tmp_path / "g")


def test_levels_reject_wrong_kinds(repo: Path) -> None:
    mods = _modules(repo)
    with pytest.raises(DeletionError):
        plan_deletion(repo, _cand("minilib.core.Stack", "class"), 1, mods)
    with pytest.raises(DeletionError):
        plan_deletion(repo, _cand("minilib.core.add", "function"), 3, mods)
    with pytest.raises(DeletionError):
        plan_deletion(repo, _cand("minilib", "module", "minilib/__init__.py", "minilib"), 3, mods)


@pytest.mark.parametrize(
    ("qualname", "kind", "level", "path", "module"),
    [
        ("minilib.core.add", "function", 1, "minilib/core.py", "minilib.core"),
        ("minilib.core.mul", "function", 2, "minilib/core.py", "minilib.core"),
        ("minilib.core.Stack.pop", "method", 2, "minilib/core.py", "minilib.core"),
        ("minilib.core.Stack", "class", 3, "minilib/core.py", "minilib.core"),
        ("minilib.textutil", "module", 3, "minilib/textutil.py", "minilib.textutil"),
    ],
)
def test_statement_never_contains_removed_code(repo: Path, qualname, kind, level, path, module) -> None:
    d = plan_deletion(repo, _cand(qualname, kind, path, module), level, _modules(repo))
    text = template_statement(d, ["tests/test_core.py::test_mul", "tests/test_text.py::test_shout"])
    assert qualname in text and "tests/test_core.py::test_mul" in text
    body_lines = [
        ln.strip()
        for ln in d.removed_code.splitlines()
        if ln.strip() and not ln.strip().startswith(('"""', "def ", "class ", "@")) and len(ln.strip()) > 8
    ]
    assert body_lines, "the removed code must have body lines for this test to mean anything"
    allowed = (d.docstring or "") + "\n".join(d.api)
    for line in body_lines:
        if line not in allowed:
            assert line not in text, line
    assert leaks(text, d) == []
    # The leak detector itself catches a statement that pastes the body in.
    assert leaks(text + "\n" + d.removed_code, d)


def test_removed_snippets_skip_lines_still_present() -> None:
    code = "def f(x):\n    value = compute_something(x)\n    return value\n"
    out = removed_snippets(code, "Compute it carefully.", ["def f(x):\n    raise NotImplementedError\n"])
    assert out == ["Compute it carefully.", "value = compute_something(x)"]
    short = removed_snippets(
        "def g():\n    return n + 1\n", None, ["def g():\n    raise NotImplementedError\n"]
    )
    assert short == ["return n + 1"]


def test_star_reexport_propagates_and_import_time_use_is_refused(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "r")
    (root / "minilib/__init__.py").write_text("from .core import *\nfrom .api import double\n")
    (root / "minilib/api.py").write_text(
        "from minilib import add, mul\n\n\ndef double(x, _unit=mul(1, 1)):\n    return add(x, x) * _unit\n"
    )
    mods = _modules(root)
    # add: re-exported by `import *` into minilib, then imported by api -> removed there too.
    d = plan_deletion(root, _cand("minilib.core.add", "function"), 2, mods)
    assert d.changed["minilib/api.py"].startswith("from minilib import mul\n")
    assert d.removed_names["minilib"] == ["add", "plus"] and d.removed_names["minilib.api"] == ["add"]
    # mul is called while minilib.api imports (a default argument): refused before any test runs.
    with pytest.raises(DeletionError, match="at import time"):
        plan_deletion(root, _cand("minilib.core.mul", "function"), 2, mods)
    core = root / "minilib/core.py"
    core.write_text(core.read_text() + "\n\nREGISTRY = {'stack': Stack, 'peek': Stack.peek}\n")
    with pytest.raises(DeletionError, match="at import time"):
        plan_deletion(root, _cand("minilib.core.Stack", "class"), 3, mods)


def test_broken_test_files_are_predicted_from_test_imports(repo: Path) -> None:
    from cadenza.tasks.validation.validate import broken_test_files

    mods = _modules(repo)
    tests = ["tests/test_core.py", "tests/test_text.py"]
    l2 = plan_deletion(repo, _cand("minilib.core.add", "function"), 2, mods)
    assert broken_test_files(l2, repo, tests, ".") == {"tests/test_core.py"}
    l1 = plan_deletion(repo, _cand("minilib.core.add", "function"), 1, mods)
    assert broken_test_files(l1, repo, tests, ".") == set()
    (repo / "tests/test_text.py").write_text(
        "from minilib.textutil import shout\n" + (repo / "tests/test_text.py").read_text()
    )
    l3 = plan_deletion(
        repo, _cand("minilib.textutil", "module", "minilib/textutil.py", "minilib.textutil"), 3, mods
    )
    assert broken_test_files(l3, repo, tests, ".") == {"tests/test_text.py"}


def test_a_broken_conftest_breaks_every_test_below_it(repo: Path) -> None:
    from cadenza.tasks.validation.validate import _under_broken, broken_test_files

    (repo / "tests/conftest.py").write_text("from minilib.core import plus\n")
    d = plan_deletion(repo, _cand("minilib.core.add", "function"), 2, _modules(repo))
    broken = broken_test_files(
        d, repo, ["tests/conftest.py", "tests/test_core.py", "tests/test_text.py"], "."
    )
    assert broken == {"tests/conftest.py", "tests/test_core.py"}
    assert _under_broken("tests/test_text.py", broken) and not _under_broken("other/test_x.py", broken)


@pytest.mark.parametrize(("future", "refused"), [("", True), ("from __future__ import annotations\n", False)])
def test_annotations_count_as_import_time_use_unless_lazy(tmp_path: Path, future: str, refused: bool) -> None:
    root = make_repo(tmp_path / "r")
    (root / "minilib/typed.py").write_text(
        f"{future}from minilib.core import Stack\n\n\ndef size(s: Stack) -> int:\n    return len(s._items)\n"
    )
    mods = _modules(root)
    cand = _cand("minilib.core.Stack", "class")
    if refused:
        with pytest.raises(DeletionError, match="at import time"):
            plan_deletion(root, cand, 3, mods)
    else:
        d = plan_deletion(root, cand, 3, mods)
        assert "from minilib.core import Stack" not in d.changed["minilib/typed.py"]


@pytest.mark.parametrize(
    ("all_src", "expected"),
    [
        ('__all__ = ("add", "mul")\n', "('mul',)"),
        ('__all__ = "add", "mul"\n', "('mul',)"),
        ('__all__ = ["mul", "add"]\n__all__ += ["plus"]\n', "['mul']"),
        ('__all__ = ("add",)\n', "()"),
        ('__all__ = ["mul"]\n__all__.append("add")\n__all__.extend(("Stack", "plus"))\n', "['mul', 'Stack']"),
    ],
)
def test_all_variants_stay_valid(tmp_path: Path, all_src: str, expected: str) -> None:
    root = make_repo(tmp_path / "r")
    core = root / "minilib/core.py"
    core.write_text(core.read_text() + "\n" + all_src)
    d = plan_deletion(root, _cand("minilib.core.add", "function"), 2, _modules(root))
    apply_deletion(root, d)
    proc = _imports(root, "import minilib.core as c; print(repr(c.__all__))")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == expected
