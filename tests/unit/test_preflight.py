"""Prerequisites are checked in the first second, each problem one line saying what to do: the system
check of ``make demo``/``make test`` (``.ci/prereqs``) and ``cadenza demo``/``cadenza train``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cadenza import preflight
from cadenza.errors import CadenzaError

ROOT = Path(__file__).resolve().parents[2]


def _path_without(tmp_path: Path, *missing: str) -> str:
    """A PATH holding links to a few real tools, without ``missing``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("git", "bwrap", "id", "mktemp", "rm", "sh"):
        found = shutil.which(tool)
        if found and tool not in missing:
            (bin_dir / tool).symlink_to(found)
    (bin_dir / "python3").symlink_to(sys.executable)
    return str(bin_dir)


def test_prereqs_names_the_missing_package_at_once(tmp_path: Path) -> None:
    """No bubblewrap and no way to install it (no apt-get on PATH): one line, the command to run."""
    start = time.monotonic()
    proc = subprocess.run(
        ["/bin/sh", str(ROOT / ".ci" / "prereqs")],
        env={"PATH": _path_without(tmp_path, "bwrap")},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 1 and time.monotonic() - start < 5
    assert proc.stderr.strip().splitlines() == [
        "error: missing bubblewrap; run: sudo apt-get install -y bubblewrap   (then rerun make)"
    ]


def test_prereqs_rejects_an_old_python(tmp_path: Path) -> None:
    old = tmp_path / "python-old"
    old.write_text("#!/bin/sh\nexit 1\n")  # what `python -c 'sys.exit(version < 3.11)'` says on 3.10
    old.chmod(0o755)
    proc = subprocess.run(
        ["/bin/sh", str(ROOT / ".ci" / "prereqs")],
        env={"PATH": os.environ["PATH"], "PY": str(old)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 1 and "needs Python >= 3.11" in proc.stderr


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="the passing case needs bubblewrap installed")
def test_prereqs_pass_on_this_machine() -> None:
    proc = subprocess.run(
        ["/bin/sh", str(ROOT / ".ci" / "prereqs")], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr


def test_demo_without_bubblewrap_stops_in_the_first_second(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": _path_without(tmp_path, "bwrap")}
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "cadenza", "demo", "--out", str(tmp_path / "run")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: bubblewrap (bwrap) is not installed"), lines
    assert time.monotonic() - start < 30  # an interpreter start, not a task build
    assert not (tmp_path / "run").exists()  # nothing was started


def test_disk_check_names_the_space_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(CadenzaError, match=r"GiB free under .*free some space or choose another output"):
        preflight.check_disk(tmp_path / "not" / "yet", need_gib=1e9)
    preflight.check_disk(tmp_path / "not" / "yet", need_gib=0.001)
    assert preflight.free_gib(tmp_path / "a" / "b") > 0


def test_training_commands_without_the_train_extra_say_what_to_install(tmp_path: Path) -> None:
    from tests.support.torchless import cadenza_torchless

    (tmp_path / "tok").mkdir()
    cfg = tmp_path / "t.toml"
    cfg.write_text(
        f'[run]\nsteps = 1\nout_dir = "{tmp_path / "run"}"\n[model]\ntokenizer = "{tmp_path / "tok"}"\n'
    )
    for args in (["train", str(cfg)], ["pretrain", str(cfg)], ["demo", "--out", str(tmp_path / "demo")]):
        proc = cadenza_torchless(*args, timeout=120)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, (args, proc.stderr[-2000:])
        assert "pip install 'cadenza[train]'" in lines[0] and "Traceback" not in proc.stderr
