"""Grading's cost helpers: the plugin cache follows the environment, and the phase clock adds up."""

from __future__ import annotations

import os
import time
from pathlib import Path

from cadenza.agent.grading.beside import Phases
from cadenza.agent.grading.grade import _env_plugins


def _dist(site: Path, name: str, module: str) -> None:
    info = site / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[pytest11]\n{name} = {module}\n")


def test_plugin_cache_sees_an_installed_plugin_and_skips_the_workspace(tmp_path: Path):
    site, ws = tmp_path / "site", tmp_path / "ws"
    site.mkdir()
    ws.mkdir()
    _dist(site, "first", "first_plugin")
    _dist(ws, "evil", "evil_plugin")  # metadata in the workspace is never a source of plugins
    assert _env_plugins([str(site), str(ws)], (ws,)) == ["first_plugin"]
    _dist(site, "second", "second_plugin")
    st = site.stat()  # the directory's mtime moves on install; force a visible step on coarse clocks
    os.utime(site, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert sorted(_env_plugins([str(site), str(ws)], (ws,))) == ["first_plugin", "second_plugin"]


def test_phases_cover_the_wall_time():
    clock = Phases()
    time.sleep(0.01)
    clock.mark("a")
    time.sleep(0.01)
    clock.mark("b")
    phases = clock.rounded()
    assert list(phases) == ["a", "b"] and all(v >= 0.01 for v in phases.values())
    assert abs(sum(clock.phases.values()) - clock.total()) < 0.01
