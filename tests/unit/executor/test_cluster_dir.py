"""A private Ray cluster's directory leaves Ray room for its unix socket paths (AF_UNIX: 107 bytes).

Found by bench/scale.py: a run directory of 43 bytes made ``ray.init`` fail once every cluster got a
directory of its own under it. No Ray needed here: the choice of directory is a pure function.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from cadenza.executor.ray import cluster_dir

# what Ray appends: /session_<date>_<time>_<us>_<pid>/sockets/plasma_store, with a 7-digit pid
RAY_SUFFIX = len("/session_2026-12-01_16-48-55_165568_1234567/sockets/plasma_store")


@pytest.fixture
def short_run_dir():
    path = tempfile.mkdtemp(prefix="c", dir="/tmp")
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


def test_a_short_run_dir_holds_its_cluster(short_run_dir):
    made = cluster_dir(str(short_run_dir))
    try:
        assert made.parent == short_run_dir / "ray" and made.is_dir()
        assert len(str(made)) + RAY_SUFFIX <= 107
    finally:
        shutil.rmtree(made, ignore_errors=True)


def test_the_run_dir_that_broke_ray_init_falls_back():
    run_dir = Path(tempfile.mkdtemp(prefix="x" * 30, dir="/tmp"))  # + "/ray": 43 bytes, as in the bench
    try:
        made = cluster_dir(str(run_dir))
        assert len(str(made)) + RAY_SUFFIX <= 107, made
        shutil.rmtree(made, ignore_errors=True)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


@pytest.mark.parametrize("depth", [30, 43, 200])
def test_a_long_run_dir_or_temp_dir_falls_back_to_a_short_one(tmp_path, monkeypatch, depth):
    run_dir = tmp_path / ("d" * depth)
    monkeypatch.setenv("TMPDIR", str(tmp_path / ("t" * 60)))  # a long temp dir as well
    (tmp_path / ("t" * 60)).mkdir()
    tempfile.tempdir = None  # re-read TMPDIR
    try:
        made = cluster_dir(str(run_dir))
    finally:
        tempfile.tempdir = None
        monkeypatch.undo()
    try:
        assert not made.is_relative_to(run_dir) and made.is_dir()
        assert len(str(made)) + RAY_SUFFIX <= 107, made
    finally:
        shutil.rmtree(made, ignore_errors=True)


def test_no_run_dir_uses_a_temp_dir():
    made = cluster_dir(None)
    try:
        assert made.name.startswith("cadenza-ray-") and len(str(made)) + RAY_SUFFIX <= 107
    finally:
        shutil.rmtree(made, ignore_errors=True)
