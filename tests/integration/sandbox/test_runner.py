"""The sandbox runner directly: separate streams, exit codes, spawner recovery, missing bubblewrap."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from cadenza.errors import SandboxError
from cadenza.sandbox import Sandbox, SandboxConfig, bwrap_path
from tests.support.sandbox_fixtures import require_protection


@pytest.fixture
def box(tmp_path: Path):
    ws = tmp_path / "ws"
    ws.mkdir()
    sb = Sandbox(ws, env_dir=sys.prefix, config=SandboxConfig(timeout_s=30), hidden=[tmp_path / "hidden"])
    yield sb
    sb.close()


def test_streams_exit_codes_and_cwd(box: Sandbox):
    res = box.run(["bash", "-c", "pwd; echo err >&2; exit 3"])
    assert (
        res.exit_code == 3
        and res.stdout == f"{box.workspace}\n"
        and res.stderr == "err\n"
        and not res.timed_out
    )
    assert box.run("python -c 'import sys; print(sys.prefix)'").stdout.strip() == os.path.realpath(sys.prefix)
    assert box.run(["no-such-binary-xyz"]).exit_code != 0


def test_close_removes_the_cgroup(box: Sandbox):
    box.run("true")
    cgroup = box._cgroup
    box.close()
    require_protection(cgroup is not None, "a writable pids cgroup")
    assert cgroup is not None and not cgroup.path.exists()


def test_missing_bubblewrap_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    bwrap_path.cache_clear()
    monkeypatch.setenv("PATH", str(tmp_path))
    try:
        with pytest.raises(SandboxError, match="apt-get install bubblewrap"):
            Sandbox(tmp_path, config=SandboxConfig())
        Sandbox(tmp_path, config=SandboxConfig(no_sandbox=True))  # trusted debugging still works
    finally:
        bwrap_path.cache_clear()


def test_command_line_is_an_allowlist(box: Sandbox):
    argv = box.argv(["true"])
    binds = [argv[i + 1] for i, a in enumerate(argv) if a in ("--ro-bind", "--bind", "--ro-bind-try")]
    assert "/" not in binds and os.path.realpath(Path.home()) not in binds
    writable = [argv[i + 1] for i, a in enumerate(argv) if a == "--bind"]
    assert writable == [os.path.realpath(box.workspace)]
    for flag in (
        "--unshare-net",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
    ):
        assert flag in argv


def test_cpu_seconds_are_limited(tmp_path: Path):
    ws = tmp_path / "ws"
    ws.mkdir()
    sb = Sandbox(ws, env_dir=sys.prefix, config=SandboxConfig(cpu_s=1, timeout_s=60))
    try:
        res = sb.run("python -c 'while True: pass'; echo status=$?")
    finally:
        sb.close()
    assert not res.timed_out and res.duration_s < 30
    assert "status=152" in res.stdout  # 128 + SIGXCPU


@pytest.mark.parametrize("persistent", [True, False])
def test_disk_quota_stops_a_bounded_write(tmp_path: Path, persistent: bool):
    ws = tmp_path / "ws"
    ws.mkdir()
    MiB = 1 << 20
    config = SandboxConfig(
        timeout_s=60, disk_quota_bytes=8 * MiB, max_file_bytes=2 * MiB, persistent=persistent
    )
    box = Sandbox(ws, config=config, hidden=[tmp_path / "hidden"])
    try:
        res = box.run(
            "for i in $(seq 1 64); do head -c 1048576 /dev/zero > f$i; sleep 0.02; done; echo finished",
            merge_stderr=True,
        )
        assert res.quota_exceeded and "disk quota exceeded" in res.output and "finished" not in res.output
        files = list(ws.iterdir())
        assert 8 <= len(files) < 64  # it reached the quota and was stopped well before the end
        used = sum(f.stat().st_blocks * 512 for f in files)
        assert used <= 8 * MiB + 16 * MiB  # bounded overshoot: one watch interval of writing
        assert box.run("rm f*; echo ok").stdout == "ok\n"  # the sandbox itself is unaffected
        res = box.run("head -c 3000000 /dev/zero > big; echo rc=$?", merge_stderr=True)
        assert "rc=0" not in res.output and (ws / "big").stat().st_size <= 2 * MiB  # one file: max_file_bytes
    finally:
        box.close()


@pytest.mark.parametrize("persistent", [True, False])
def test_stop_callback_kills_a_running_command(tmp_path: Path, persistent: bool):
    """Grading stops its second (F2P-alone) run once the main run has failed: ``stop`` is polled while a
    command runs, and the reason it gives kills the command's tree; without a reason it runs to the end."""
    import threading

    ws = tmp_path / "ws"
    ws.mkdir()
    box = Sandbox(ws, config=SandboxConfig(timeout_s=60, persistent=persistent), hidden=[tmp_path / "hidden"])
    try:
        flag = threading.Event()
        threading.Timer(0.5, flag.set).start()
        res = box.run(
            "sleep 20; echo finished",
            merge_stderr=True,
            stop=lambda: "not needed" if flag.is_set() else None,
        )
        assert "not needed" in res.output and "finished" not in res.output and res.duration_s < 10
        assert box.run("echo ok", stop=lambda: None).stdout == "ok\n"
    finally:
        box.close()


def test_single_call_sandbox_is_capped_by_its_pids_cgroup(tmp_path: Path):
    """Grading's one-shot sandboxes start the command directly (no spawner): it must still join the
    sandbox's pids cgroup, so its process count is capped, and nothing of it outlives the call."""
    ws = tmp_path / "ws"
    ws.mkdir()
    box = Sandbox(
        ws,
        env_dir=sys.prefix,
        config=SandboxConfig(timeout_s=30, persistent=False, max_procs=24),
        hidden=[tmp_path / "hidden"],
        single_call=True,
    )
    require_protection(box._cgroup_root is not None, "a writable pids cgroup")
    script = (
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "    while n < 200:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(60); os._exit(0)\n"
        "        n += 1\n"
        "except OSError:\n"
        "    pass\n"
        "print('forked', n, flush=True)\n"
    )
    try:
        res = box.run(["python", "-c", script])
        assert box._spawner is None and box._cgroup is not None
        assert res.stdout.startswith("forked ") and int(res.stdout.split()[1]) < 24, res
        assert box._cgroup.pids() == []  # the sleeping children were killed with the call
        assert box.run(["bash", "-c", "yes | head -n 1; echo ${PIPESTATUS[0]}"]).stdout == "y\n141\n"
        cgroup = box._cgroup
    finally:
        box.close()
    assert not cgroup.path.exists()
