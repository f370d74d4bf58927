"""A real task venv with pytest, built in well under a second, shared by every module and worker of a run.

``python -m venv --without-pip``, then pytest and its runtime requirements copied file by file from
this interpreter's installed distributions (their RECORD lists). The result is an ordinary venv whose
``bin/python -m pytest`` works, without a pip run per test module.
"""

from __future__ import annotations

import importlib.metadata as md
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.support.run_cache import build_once


def _closure(name: str) -> list[md.Distribution]:
    seen: dict[str, md.Distribution] = {}
    todo = [name]
    while todo:
        req = Requirement(todo.pop())
        key = req.name.lower().replace("_", "-")
        if key in seen or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        dist = md.distribution(req.name)
        seen[key] = dist
        todo.extend(dist.requires or [])
    return list(seen.values())


def build_pytest_venv(env: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    site = next((env / "lib").glob("python3*/site-packages"))
    for dist in _closure("pytest"):
        for f in dist.files or []:
            src = Path(dist.locate_file(f))
            if f.parts[0] in ("..", "/") or "__pycache__" in f.parts or not src.is_file():
                continue
            dst = site / f
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    python = str(env / "bin" / "python")
    if subprocess.run([python, "-c", "import pytest"], capture_output=True).returncode != 0:
        # Distributions without a RECORD (unusual installs): fall back to pip, as a user would.
        subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-q",
                        "--disable-pip-version-check", "pytest"], check=True, timeout=600)  # fmt: skip
    return env


@pytest.fixture(scope="session")
def task_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real venv with pytest (the task environment of the toy tasks): one fast build per session."""
    return build_once(tmp_path_factory, "monitor-task-env", lambda d: build_pytest_venv(d / "env")) / "env"
