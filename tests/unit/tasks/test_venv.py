"""The light per-task env: editable import from the workspace, metadata, chained base site-packages."""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
from pathlib import Path

from cadenza.tasks.sources.fetch import fetch_source
from cadenza.tasks.sources.venv import BaseEnv, make_task_env
from tests.support.tasks_helpers import make_repo


def _base_from_this_interpreter(info) -> BaseEnv:
    # Stand-in base: this interpreter's own site-packages (has pytest); the real one is built in integration
    # tests.
    site = Path(sysconfig.get_paths()["purelib"])
    return BaseEnv(
        root=site.parents[2],
        site_packages=site,
        dist_name=info.name,
        version=info.version,
        import_root=info.import_root,
        packages=info.packages,
    )


def test_task_env_imports_workspace_editable_and_is_relocatable(tmp_path: Path) -> None:
    info = fetch_source(str(make_repo(tmp_path / "r", layout="src")), tmp_path / "task" / "workspace")
    py = make_task_env(_base_from_this_interpreter(info), info.root, tmp_path / "task" / "env")
    code = (
        "import minilib, importlib.metadata as m, pytest; "
        "print(minilib.__file__); print(m.version('minilib')); "
        "print(m.distribution('minilib').read_text('top_level.txt'))"
    )
    out = subprocess.run([str(py), "-c", code], capture_output=True, text=True, env={}, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == str((info.root / "src" / "minilib" / "__init__.py").resolve())
    assert lines[1:3] == ["0.3.1", "minilib"]
    # Edits in the workspace are live (editable), and the env moves with its task directory.
    core = info.root / "src" / "minilib" / "core.py"
    core.write_text(core.read_text() + "\n\ndef add(a, b):\n    return 'edited'\n")
    shutil.move(tmp_path / "task", tmp_path / "moved")
    py2 = tmp_path / "moved" / "env" / "bin" / "python"
    out = subprocess.run(
        [str(py2), "-c", "import minilib.core as c; print(c.add(1, 2), c.__file__)"],
        capture_output=True,
        text=True,
        env={},
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["edited", str((tmp_path / "moved/workspace/src/minilib/core.py").resolve())]
    site = tmp_path / "moved" / "env" / "lib"
    assert not [p for p in site.rglob("*") if p.name in ("core.py", "__init__.py")], (
        "no copy of the package in the env"
    )
