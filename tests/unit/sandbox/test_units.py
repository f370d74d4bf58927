"""Sandbox pieces that need no bubblewrap: output capping, the bind allowlist, config validation."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from cadenza.errors import ConfigError, SandboxError
from cadenza.sandbox import CappedBuffer, SandboxConfig, cap_text
from cadenza.sandbox.binds import plan_binds
from cadenza.sandbox.envinfo import EnvInfo


@pytest.mark.parametrize("limit", [1, 7, 64, 1000])
def test_capped_buffer_keeps_head_and_tail(limit: int):
    rng = random.Random(limit)
    data = bytes(rng.randrange(97, 123) for _ in range(5000))
    buf = CappedBuffer(limit)
    pos = 0
    while pos < len(data):  # random chunking must not matter
        step = rng.randrange(1, 300)
        buf.feed(data[pos : pos + step])
        pos += step
    head, tail = limit // 2, limit - limit // 2
    assert bytes(buf.head) == data[:head] and bytes(buf.tail) == data[len(data) - tail :]
    assert buf.dropped == len(data) - limit
    text = buf.text()
    assert f"[... {len(data) - limit} bytes of output truncated ...]" in text
    assert text.startswith(data[:head].decode()) and text.endswith(data[len(data) - tail :].decode())


def test_small_output_untouched_and_invalid_utf8_replaced():
    buf = CappedBuffer(100)
    buf.feed(b"ok \xff\xfe end")
    assert buf.dropped == 0 and buf.text() == "ok \ufffd\ufffd end"
    assert cap_text("short", 10) == "short"
    assert "truncated" in cap_text("x" * 50, 10)


def test_config_rejects_nonsense():
    with pytest.raises(ConfigError, match="timeout_s"):
        SandboxConfig(timeout_s=0)
    with pytest.raises(ConfigError, match="home"):
        SandboxConfig(home="relative")


def _env(tmp: Path, sys_path: list[str]) -> EnvInfo:
    return EnvInfo(
        env_dir=str(tmp / "env"),
        executable="",
        prefix=str(tmp / "env"),
        base_prefix=str(tmp / "base"),
        base_exec_prefix=str(tmp / "base"),
        sys_path=tuple(sys_path),
        stdlib_names=frozenset(),
        installed_names=frozenset(),
    )


def test_binds_are_an_allowlist(tmp_path: Path):
    for d in (
        "env/site",
        "base/lib",
        "ws",
        "taskset/t1/workspace/src",
        "elsewhere/src",
        "taskset/t2/workspace",
        "taskset/.envs/shared/site",
    ):
        (tmp_path / d).mkdir(parents=True)
    for task in ("t1", "t2"):
        (tmp_path / "taskset" / task / "task.json").write_text("{}")
    ws = tmp_path / "ws"
    shared = str(tmp_path / "taskset/.envs/shared/site")
    env = _env(
        tmp_path,
        [
            str(tmp_path / "base/lib"),
            str(tmp_path / "env/site"),
            str(tmp_path / "elsewhere/src"),
            str(tmp_path / "taskset/t1/workspace/src"),
            str(tmp_path / "taskset/t2/workspace"),
            shared,
            "/",
            str(tmp_path),
        ],
    )
    plan = plan_binds(
        workspace=ws,
        env=env,
        hidden=[tmp_path / "taskset/t1", tmp_path / "taskset"],
        path_map={tmp_path / "taskset/t1/workspace": ws},
    )
    ro = set(plan.ro)
    assert "/" not in ro and str(tmp_path) not in ro and str(tmp_path / "taskset") not in ro
    assert {str(tmp_path / "env"), str(tmp_path / "base"), str(tmp_path / "elsewhere/src")} <= ro
    # a shared env inside the task set may be bound; nothing inside a task directory may
    assert [p for p in ro if p.startswith(str(tmp_path / "taskset"))] == [shared]
    assert plan.pythonpath == [str(ws / "src")]  # an editable path into the pristine tree follows the copy
    assert plan.rw == [os.path.realpath(ws)]


def test_sys_path_reaches_into_home_only_through_site_packages(tmp_path: Path, monkeypatch):
    """A ``.pth`` line of an installed package may put any directory on ``sys.path``; inside the home
    directory only environments' package directories are bound (an env cache in ``~/.cache``)."""
    home = tmp_path / "home"
    site = home / ".cache/envs/base/lib/python3.11/site-packages"
    for d in (site, home / ".ssh", tmp_path / "ws"):
        d.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    env = _env(tmp_path, [str(site), str(home / ".ssh")])
    ro = plan_binds(workspace=tmp_path / "ws", env=env, hidden=[]).ro
    assert str(site) in ro and str(home / ".ssh") not in ro
    assert not [p for p in ro if p == str(home)]


def test_env_that_would_expose_the_task_set_is_refused(tmp_path: Path):
    (tmp_path / "taskset").mkdir()
    (tmp_path / "ws").mkdir()
    env = _env(tmp_path, [])
    env = EnvInfo(**{**env.__dict__, "env_dir": str(tmp_path)})
    with pytest.raises(SandboxError, match="would expose"):
        plan_binds(workspace=tmp_path / "ws", env=env, hidden=[tmp_path / "taskset"])


def test_hidden_roots(tmp_path: Path):
    from cadenza.sandbox import hidden_roots

    task = tmp_path / "set" / "t1"
    assert hidden_roots(task) == [Path(os.path.realpath(task)), Path(os.path.realpath(task.parent))]
    import tempfile

    in_tmp = Path(tempfile.gettempdir()) / "t1"
    assert hidden_roots(in_tmp) == [Path(os.path.realpath(in_tmp))]  # /tmp is not a task set
    assert hidden_roots("/t1") == [Path("/t1")]


@pytest.mark.parametrize("system_site", [False, True])
def test_env_probe_runs_no_code_of_the_env_and_sees_the_same_sys_path(tmp_path, system_site):
    """The host-side probe re-does ``site``'s ``.pth`` processing as text: the same ``sys.path`` as the
    env's own interpreter, while an ``import`` line of a ``.pth`` (code of an installed package) never
    runs on the host."""
    import json
    import subprocess
    import sys
    import venv

    from cadenza.sandbox.envinfo import _probe

    env = tmp_path / "env"
    venv.EnvBuilder(with_pip=False, system_site_packages=system_site).create(env)
    site_dir = next(env.glob("lib/python*/site-packages"))
    extra = tmp_path / "extra"
    extra.mkdir()
    marker = tmp_path / "ran-on-host"
    chained, inner = tmp_path / "chained", tmp_path / "inner"
    chained.mkdir()
    inner.mkdir()
    (chained / "inner.pth").write_text(f"{inner}\n")  # reached only through the addsitedir idiom below
    (site_dir / "evil.pth").write_text(f"{extra}\nimport os; open({str(marker)!r}, 'w').close()\n# comment\n")
    (site_dir / "zchain.pth").write_text(f"import site; site.addsitedir({str(chained)!r})\n")
    info = _probe(str(env), -1)
    assert not marker.exists()  # the import line did not run
    code = "import sys, json; print(json.dumps([sys.prefix, [p for p in sys.path if p]]))"
    real = subprocess.run([str(env / "bin" / "python"), "-c", code], capture_output=True, text=True, cwd="/",
                          env={"PATH": "/usr/bin:/bin"}, timeout=60)  # fmt: skip
    prefix, path = json.loads(real.stdout)
    assert marker.exists()  # the same line is live code when site runs for real (the probe's reference)
    assert list(info.sys_path) == path and info.prefix == prefix
    assert {str(extra), str(chained), str(inner)} <= set(info.sys_path)
    assert sys.base_prefix == info.base_prefix
