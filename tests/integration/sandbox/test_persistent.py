"""The persistent sandbox (one bubblewrap instance per Sandbox, an exec server inside): each call still
starts from a clean slate apart from workspace files, and nothing of a call outlives it.

Every test checks what the host sees (its /proc, the workspace) as well as what the command printed.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from pathlib import Path

import pytest

from cadenza.sandbox import Sandbox, SandboxConfig
from tests.support.sandbox_fixtures import require_protection

MiB = 1 << 20


def _box(tmp_path: Path, **overrides) -> Sandbox:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    config = SandboxConfig(
        timeout_s=20, max_procs=64, memory_bytes=1 << 30, tmpfs_bytes=16 * MiB, **overrides
    )
    return Sandbox(ws, env_dir=sys.prefix, config=config, hidden=[tmp_path / "hidden"])


@pytest.fixture
def box(tmp_path: Path):
    sb = _box(tmp_path)
    assert sb.persistent
    yield sb
    sb.close()


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                pass
    return found


def _server_pid(box: Sandbox) -> int:
    assert box._server is not None and box._server.alive()
    return box._server.proc.pid


def test_calls_share_one_instance_but_no_state_but_workspace_files(box: Sandbox):
    marker = f"bg{uuid.uuid4().hex[:8]}"
    first = box.run(
        "echo data > /tmp/t; mkdir -p ~/.cache/d; echo h > ~/.cache/d/f; echo s > /dev/shm/s; chmod 000 "
        "~/.cache/d;"
        f" echo kept > ws-file; ipcmk -M 4096 >/dev/null && echo shm-made;"
        f" nohup sh -c 'sleep 600; echo {marker}' >/dev/null 2>&1 & setsid sleep 601 & echo started"
    )
    assert first.exit_code == 0 and "started" in first.stdout and "shm-made" in first.stdout, first
    assert first.duration_s < 10  # the background sleeps were killed when the shell exited
    assert not _processes_with(marker)
    pid = _server_pid(box)
    second = box.run(
        "ls -A /tmp /dev/shm ~; ipcs -m | grep -c '^0x' || true; cat ws-file; pgrep -c sleep || true"
    )
    lines = second.stdout.splitlines()
    assert "t" not in lines and "s" not in lines and ".cache" not in lines, second.stdout
    assert "kept" in lines and lines[-1] == "0" and lines[-3] == "0", second.stdout  # no segment, no sleeps
    assert (box.workspace / "ws-file").read_text() == "kept\n"
    assert _server_pid(box) == pid  # same instance: the state really was cleaned, not thrown away
    res = box.run("touch /dev/evil; echo $?")
    assert res.stdout.strip() != "0" and not Path("/dev/evil").exists()


def test_each_call_gets_its_own_environment_and_cwd(box: Sandbox):
    (box.workspace / "sub").mkdir()
    assert box.run("export LEAK=1; cd /; ulimit -n 64; echo $LEAK").stdout == "1\n"
    res = box.run("echo ${LEAK:-unset} $(pwd) $(ulimit -n)", cwd=box.workspace / "sub", env={"OWN": "x"})
    leak, cwd, nofile = res.stdout.split()
    assert leak == "unset" and cwd == str(box.workspace / "sub") and nofile != "64"
    assert box.run("echo $OWN").stdout == "\n"


def test_timeout_kills_the_whole_tree_and_the_next_call_works(box: Sandbox):
    marker = f"loop{uuid.uuid4().hex[:8]}"
    box.run("true")
    pid = _server_pid(box)
    t0 = time.monotonic()
    res = box.run(
        f"(sleep 300; echo {marker}) & setsid sh -c 'sleep 301; echo {marker}' & while true; do :; done",
        timeout_s=2,
    )
    assert res.timed_out and res.exit_code == -signal.SIGKILL and time.monotonic() - t0 < 10
    assert not _processes_with(marker)
    assert box.run("echo after").stdout == "after\n" and _server_pid(box) == pid


def test_server_death_is_survived(box: Sandbox):
    assert box.run("echo one").stdout == "one\n"
    old = _server_pid(box)
    os.killpg(old, signal.SIGKILL)  # from the host: bwrap and its namespace
    box._server.proc.wait(timeout=10)  # type: ignore[union-attr]
    assert box.run("echo two").stdout == "two\n"
    new = _server_pid(box)
    assert new != old
    res = box.run("kill -9 $PPID; sleep 5; echo unreachable")  # from inside: a command kills the server
    assert "unreachable" not in res.stdout and res.exit_code != 0 and res.duration_s < 5
    assert box.run("echo three").stdout == "three\n" and _server_pid(box) != new


def test_fork_bomb_is_contained_and_the_instance_recovers(box: Sandbox):
    require_protection(box.process_limit_enforced, "a process cap (pids cgroup or RLIMIT_NPROC)")
    marker = f"bomb{uuid.uuid4().hex[:8]}"
    res = box.run(f"{marker}(){{ {marker} | {marker} & }}; {marker}; sleep 2; echo survived", timeout_s=5)
    assert res.duration_s < 15, res
    assert not _processes_with(marker)
    res = box.run(
        "python -c 'import os\nn = 0\ntry:\n    while n < 500:\n        if os.fork() == 0:\n"
        "            import time; time.sleep(60); os._exit(0)\n        n += 1\nexcept OSError:\n    pass\n"
        "print(n)'",
        timeout_s=20,
    )
    assert int(res.stdout) < box.config.max_procs, res
    assert box.run("echo fine").stdout == "fine\n"


def test_close_stops_the_instance(tmp_path: Path):
    box = _box(tmp_path)
    box.run("true")
    pid = _server_pid(box)
    cgroup = box._cgroup
    box.close()
    assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    require_protection(cgroup is not None, "a writable pids cgroup")
    assert cgroup is not None and not cgroup.path.exists()


def test_per_call_mode_is_kept(tmp_path: Path):
    box = _box(tmp_path, persistent=False)
    try:
        assert not box.persistent
        assert box.run("echo x > /tmp/t; echo hi").stdout == "hi\n"
        assert "t" not in box.run("ls /tmp").stdout.split() and box._server is None
        # per-call mode's own long-lived piece is the cgroup's spawner: it exists only with a cgroup
        require_protection(box._spawner is not None, "a writable pids cgroup (and its spawner)")
        os.kill(box._spawner.pid, signal.SIGKILL)
        box._spawner.proc.wait()
        assert box.run("echo again").stdout == "again\n"
    finally:
        box.close()


def test_oversized_request_fails_alone(box: Sandbox):
    box.run("true")
    pid = _server_pid(box)
    res = box.run("echo " + "a" * 400_000)
    assert res.exit_code == 127 and "too large" in res.output
    assert box.run("echo ok").stdout == "ok\n" and _server_pid(box) == pid


def test_falls_back_to_per_call_without_a_usable_interpreter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    box = _box(tmp_path)
    monkeypatch.setattr(box, "_server_pythons", lambda: [str(tmp_path / "no-python")])
    try:
        assert box.run("echo x > /tmp/t; echo hi").stdout == "hi\n"
        assert not box.persistent and box._server is None
        assert "t" not in box.run("ls /tmp").stdout.split()
    finally:
        box.close()
