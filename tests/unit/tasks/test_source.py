"""Sources (copy, git HEAD, layouts, bad input) and requirement discovery."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from cadenza.errors import SourceError
from cadenza.tasks.sources.deps import discover_requirements
from cadenza.tasks.sources.fetch import fetch_source
from tests.support.tasks_helpers import make_repo


def test_local_dir_is_copied_never_modified(tmp_path: Path) -> None:
    src = make_repo(tmp_path / "src")
    (src / "minilib" / "__pycache__").mkdir()
    (src / "minilib" / "__pycache__" / "core.cpython-311.pyc").write_bytes(b"\0")
    (src / ".mypy_cache").mkdir()
    before = sorted(p.relative_to(src) for p in src.rglob("*"))
    info = fetch_source(str(src), tmp_path / "copy")
    assert sorted(p.relative_to(src) for p in src.rglob("*")) == before
    assert not (info.root / "minilib" / "__pycache__").exists() and not (info.root / ".mypy_cache").exists()
    assert (info.name, info.version, info.packages, info.import_root, info.layout) == (
        "minilib",
        "0.3.1",
        ["minilib"],
        ".",
        "flat",
    )
    assert "tests/test_core.py" in info.test_paths and "pyproject.toml" in info.test_paths
    assert fetch_source(str(src), tmp_path / "copy2").content_hash == info.content_hash


def test_src_layout_and_tests_inside_package(tmp_path: Path) -> None:
    info = fetch_source(str(make_repo(tmp_path / "s", layout="src")), tmp_path / "c1")
    assert (info.layout, info.import_root, info.package_dirs) == ("src", "src", {"minilib": "src/minilib"})
    inside = make_repo(tmp_path / "i")
    (inside / "tests").rename(inside / "minilib" / "tests")
    (inside / "minilib" / "tests" / "__init__.py").write_text("")
    info2 = fetch_source(str(inside), tmp_path / "c2")
    assert info2.layout == "tests-inside-package"


def test_git_repo_copies_committed_head_only(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "g")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "x"], cwd=repo, check=True)
    (repo / "minilib" / "core.py").write_text("# uncommitted edit\n")
    info = fetch_source(str(repo), tmp_path / "copy")
    assert not (info.root / ".git").exists()
    assert (info.root / "minilib" / "core.py").read_text().startswith('"""Core arithmetic."""')
    assert (repo / "minilib" / "core.py").read_text() == "# uncommitted edit\n"


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda p: None, "does not exist"),
        (lambda p: (p.mkdir(), (p / "README").write_text("hi")), "no Python files"),
        (
            lambda p: (p.mkdir(), (p / "pkg").mkdir(), (p / "pkg" / "__init__.py").write_text("")),
            "has no tests",
        ),
        (lambda p: (p.mkdir(), (p / "test_x.py").write_text("def test(): pass\n")), "no importable package"),
    ],
)
def test_bad_sources_give_one_line_errors(tmp_path: Path, setup, message: str) -> None:
    src = tmp_path / "src"
    setup(src)
    with pytest.raises(SourceError, match=message) as exc:
        fetch_source(str(src), tmp_path / "dest")
    assert "\n" not in str(exc.value)


def test_bad_pypi_spec_is_rejected_without_network(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="NAME or NAME==VERSION"):
        fetch_source("pypi:not a name", tmp_path / "d")


def test_requirement_discovery_reads_all_channels(tmp_path: Path) -> None:
    root = tmp_path / "r"
    root.mkdir()
    (root / "pyproject.toml").write_text(
        textwrap.dedent("""\
        [project]
        name = "demo-pkg"
        dependencies = ["attrs>=22"]
        [project.optional-dependencies]
        test = ["hypothesis", "demo-pkg[extra]"]
        docs = ["sphinx"]
        [dependency-groups]
        lint = ["ruff"]
        dev = ["pytest-cov", {include-group = "tests"}]
        tests = ["pytest-asyncio>=0.23", "mypy"]
        """)
    )
    (root / "requirements-test.txt").write_text("-r requirements-base.txt\nfreezegun  # time\n-e .\n")
    (root / "requirements-base.txt").write_text("six\n")
    (root / "tox.ini").write_text(
        "[testenv]\ndeps =\n    pytest\n    flake8\n    {env:EXTRA:}\n    py311: tomli\n"
    )
    (root / "setup.cfg").write_text("[options.extras_require]\ntesting = responses\n")
    reqs = discover_requirements(root, ["demo-pkg", "demo_pkg"])
    assert reqs.runtime == ["attrs>=22"]
    assert sorted(reqs.test) == sorted(
        ["hypothesis", "pytest-asyncio>=0.23", "six", "freezegun", "pytest", "responses"]
    )
    assert "pyproject.toml" in reqs.sources and "tox.ini" in reqs.sources


def test_requirements_from_pkg_info_extras(tmp_path: Path) -> None:
    root = tmp_path / "r"
    root.mkdir()
    (root / "PKG-INFO").write_text(
        "Metadata-Version: 2.4\nName: foo\nVersion: 1\nRequires-Dist: idna\n"
        'Requires-Dist: pytest-mock; extra == "tests"\nRequires-Dist: furo; extra == "docs"\n'
    )
    reqs = discover_requirements(root, ["foo"])
    assert reqs.runtime == ["idna"] and reqs.test == ["pytest-mock"]


def test_plugins_the_tests_visibly_use_are_detected(tmp_path: Path) -> None:
    root = tmp_path / "r"
    (root / "tests").mkdir(parents=True)
    (root / "tests" / "test_x.py").write_text(
        textwrap.dedent("""\
        import pytest
        import yaml
        from hypothesis import given

        @pytest.mark.asyncio
        async def test_a(mocker):
            pass

        def test_b(some_unknown_fixture):
            import leftpad_unknown
        """)
    )
    reqs = discover_requirements(root, ["x"], ["tests/test_x.py"])
    assert sorted(reqs.test) == ["hypothesis", "pytest-asyncio", "pytest-mock", "pyyaml"]
    assert "test code" in reqs.sources


def test_namespace_package_in_src(tmp_path: Path) -> None:
    root = tmp_path / "ns"
    (root / "src" / "acme" / "widgets").mkdir(parents=True)
    (root / "src" / "acme" / "widgets" / "__init__.py").write_text("def spin():\n    return 1\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_w.py").write_text(
        "from acme.widgets import spin\ndef test_spin():\n    assert spin() == 1\n"
    )
    info = fetch_source(str(root), tmp_path / "copy")
    assert (info.packages, info.package_dirs, info.layout) == (["acme"], {"acme": "src/acme"}, "src")


def test_local_sdist_archive_and_unsafe_archives(tmp_path: Path) -> None:
    import tarfile
    import zipfile

    src = make_repo(tmp_path / "minilib-0.3.1")
    archive = tmp_path / "minilib-0.3.1.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src, arcname="minilib-0.3.1")
    info = fetch_source(str(archive), tmp_path / "copy")
    assert (info.name, info.packages, info.layout) == ("minilib", ["minilib"], "flat")
    assert (info.root / "tests" / "test_core.py").is_file()
    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(evil, "w") as zf:
        zf.writestr("../outside.py", "x = 1\n")
    with pytest.raises(SourceError, match="unsafe path"):
        fetch_source(str(evil), tmp_path / "copy2")
    assert not (tmp_path / "outside.py").exists()
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(SourceError, match="not a directory or an sdist"):
        fetch_source(str(tmp_path / "notes.txt"), tmp_path / "copy3")
