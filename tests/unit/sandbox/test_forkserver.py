"""The fork servers' program is a real module: importable without side effects and run from its file."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from cadenza.sandbox import forkserver
from cadenza.sandbox.spawner import Spawner


def test_usage_error_without_a_mode():
    with pytest.raises(SystemExit, match=r"usage: forkserver\.py"):
        forkserver.main([])


def test_keep_modes_covers_the_path_to_every_mount_point(tmp_path: Path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    os.chmod(tmp_path / "a", 0o751)
    keep = forkserver.keep_modes([str(tmp_path)], [str(tmp_path / "a" / "b"), "/elsewhere"])
    assert set(keep) == {str(tmp_path), str(tmp_path / "a"), str(tmp_path / "a" / "b")}
    assert keep[str(tmp_path / "a")] == 0o751


def test_remove_takes_locked_directories(tmp_path: Path):
    locked = tmp_path / "x" / "locked"
    locked.mkdir(parents=True)
    (locked / "f").write_text("data")
    os.chmod(locked, 0)
    forkserver.remove(str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()


def test_spawn_mode_runs_a_command_from_the_module_file(tmp_path: Path):
    spawner = Spawner(lambda: None)
    try:
        assert spawner.proc.args[3] == forkserver.__file__ and spawner.proc.args[4] == "spawn"
        r, w = os.pipe()
        pid = spawner.spawn(["/bin/sh", "-c", "echo hi; exit 3"], {"PATH": "/bin"}, str(tmp_path), [w, w])
        os.close(w)
        assert pid > 0 and spawner.wait(time.monotonic() + 30) == 3
        assert os.read(r, 100) == b"hi\n"
        os.close(r)
    finally:
        spawner.close()
    assert spawner.proc.returncode is not None
