"""Red team, sandbox channels: each attack runs as a real tool call in a real bubblewrap sandbox.

Every test asserts what the host sees afterwards (files, processes), not only what the agent saw.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from cadenza.agent.env import ToolCall
from cadenza.agent.episode import Episode, EpisodeConfig
from cadenza.agent.tools import ToolsConfig
from cadenza.sandbox import SandboxConfig
from tests.support.sandbox_fixtures import require_protection

MiB = 1 << 20


@pytest.fixture
def episode(task_dir: Path):
    config = EpisodeConfig(
        sandbox=SandboxConfig(
            timeout_s=20,
            max_procs=64,
            max_file_bytes=8 * MiB,
            memory_bytes=1 << 30,
            cpu_s=20,
            tmpfs_bytes=16 * MiB,
        ),
        tools=ToolsConfig(bash_timeout_s=30, max_observation_bytes=8000),
    )
    ep = Episode(task_dir, config)
    ep.reset()
    yield ep
    ep.close()


def bash(ep: Episode, command: str):
    return ep.step(ToolCall(name="bash", arguments={"command": command}))


def call(ep: Episode, tool: str, **args):
    return ep.step(ToolCall(name=tool, arguments=args))


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


def test_workspace_is_writable_and_cwd(episode: Episode):
    res = bash(episode, "pwd && echo hello > note.txt && cat note.txt")
    assert res.error_kind is None
    assert str(episode.workspace) in res.observation and "hello" in res.observation
    assert (episode.workspace / "note.txt").read_text() == "hello\n"


def test_writes_outside_workspace_do_not_reach_host(episode: Episode, task_dir: Path, task_env: Path):
    targets = [
        task_dir / "gold.patch",
        task_dir / "pwned",
        task_env / "pwned",
        Path.home() / f"pwned-{uuid.uuid4().hex}",
        Path("/etc") / f"pwned-{uuid.uuid4().hex}",
        Path("/usr/pwned"),
    ]
    before = (task_dir / "gold.patch").read_text()
    script = "; ".join(f"echo x > {t}" for t in targets) + f"; touch /pwned; mkdir -p {task_dir}/x; echo done"
    res = bash(episode, script)
    assert "done" in res.observation
    for t in targets[1:]:
        assert not t.exists(), t
    assert not (task_dir / "x").exists()
    assert (task_dir / "gold.patch").read_text() == before
    assert not Path("/pwned").exists()
    # kernel settings: the value written is the one already there, so a failure of this test harms nothing
    res = bash(
        episode, "v=$(cat /proc/sys/vm/swappiness); echo $v > /proc/sys/vm/swappiness && echo WROTE-SYSCTL"
    )
    assert "WROTE-SYSCTL" not in res.observation and "Read-only file system" in res.observation
    # the env's site-packages is read-only: a .pth cannot be planted there
    site = next(task_env.glob("lib/python*/site-packages"))
    res = bash(episode, f"echo 'import os' > {site}/evil.pth")
    assert "Read-only file system" in res.observation and not (site / "evil.pth").exists()


def test_task_set_gold_patch_and_other_tasks_are_invisible(episode: Episode, taskset: Path):
    other = taskset / "calc-other"
    res = bash(
        episode,
        f"cat {taskset}/calc-clamp/gold.patch; ls {taskset}; cat {other}/task.json; "
        f"ls {other}/workspace; find / -path /proc -prune -o -path /usr -prune -o -name gold.patch -print; "
        "echo end",
    )
    assert "max(lo, min(x, hi))" not in res.observation
    assert "calc-other" not in res.observation.replace(str(other), "")
    assert '"fail_to_pass"' not in res.observation
    assert "No such file or directory" in res.observation and "gold.patch\n" not in res.observation


def test_host_home_and_pip_cache_are_invisible(episode: Episode, task_env: Path):
    home = os.path.realpath(Path.home())
    canary = Path(home) / f".cadenza-canary-{uuid.uuid4().hex[:8]}"  # so a clean host home is no pass
    canary.write_text("secret\n")
    try:
        res = bash(episode, f"ls -A {home}; cat {canary}; echo end")
    finally:
        canary.unlink()
    lines = res.observation.splitlines()
    shown = set(lines[: next(i for i, ln in enumerate(lines) if ln.startswith("cat:"))])
    assert canary.name not in shown and "secret" not in res.observation
    # only the path components that lead to read-only binds (e.g. a pyenv interpreter) may show up
    allowed = {Path(p).relative_to(home).parts[0] for p in _binds(episode) if Path(p).is_relative_to(home)}
    assert shown <= allowed, shown - allowed
    res = bash(
        episode,
        f"test -e {home}/.cache/pip && echo VISIBLE; test -e {home}/.bashrc && echo VISIBLE; "
        "echo HOME=$HOME; env",
    )
    assert "VISIBLE" not in res.observation
    assert f"HOME={episode.config.sandbox.home}" in res.observation
    host_only = [
        k
        for k in os.environ
        if k not in ("HOME", "PATH", "LANG", "TERM", "USER", "TMPDIR", "PWD", "SHLVL", "_")
    ]
    leaked = [k for k in host_only if f"{k}=" in res.observation]
    assert not leaked


def _binds(ep: Episode) -> list[str]:
    return ep._toolbox.sandbox.plan.ro  # type: ignore[union-attr]


def test_network_is_unreachable(episode: Episode):
    script = (
        "import socket\n"
        "print('ifaces', [n for _, n in socket.if_nameindex()])\n"
        "for host in [('1.1.1.1', 80), ('pypi.org', 443)]:\n"
        "    try:\n"
        "        socket.create_connection(host, timeout=3); print('CONNECTED', host)\n"
        "    except OSError as e:\n"
        "        print('blocked', type(e).__name__)\n"
    )
    call(episode, "create", path="net.py", content=script)
    res = bash(episode, "python net.py; pip download --no-deps -d /tmp/x calc 2>&1 | tail -1")
    assert "CONNECTED" not in res.observation
    assert res.observation.count("blocked") == 2
    assert "ifaces ['lo']" in res.observation


def test_fork_bomb_is_contained_and_cleaned_up(episode: Episode):
    sandbox = episode._toolbox.sandbox  # type: ignore[union-attr]
    # without a cap (no writable pids cgroup, running as root) fork-bombing would hit the host
    require_protection(sandbox.process_limit_enforced, "a process cap (pids cgroup or RLIMIT_NPROC)")
    marker = f"bomb{uuid.uuid4().hex[:8]}"
    episode.config.tools.bash_timeout_s = 5
    res = bash(episode, f"{marker}(){{ {marker} | {marker} & }}; {marker}; sleep 2; echo survived")
    # either the shell outlived the bomb, or it could not fork any more (the cap) and gave up or timed out
    assert res.done is False
    assert "survived" in res.observation or "Resource temporarily unavailable" in res.observation, (
        res.observation
    )
    assert not _processes_with(marker)
    episode.config.tools.bash_timeout_s = 30
    script = (
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "    while n < 1000:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(60); os._exit(0)\n"
        "        n += 1\n"
        "except OSError:\n"
        "    pass\n"
        "print('forked', n)\n"
    )
    call(episode, "create", path="forker.py", content=script)
    res = bash(episode, f"python forker.py {marker}")
    forked = int(res.observation.split("forked ")[1].split()[0])
    assert forked < episode.config.sandbox.max_procs
    assert not _processes_with(marker)


def test_infinite_loop_times_out_and_tree_is_killed(episode: Episode):
    marker = f"loop{uuid.uuid4().hex[:8]}"
    episode.config.tools.bash_timeout_s = 4
    res = bash(episode, f"(sleep 300; echo {marker}) & while true; do :; done")
    assert res.error_kind == "timeout" and "timed out after 4s" in res.observation
    assert episode.trajectory.turns[-1].duration_s < 15
    assert not _processes_with(marker)


def test_cpu_and_memory_rlimits(episode: Episode):
    res = bash(episode, "python -c 'x = bytearray(3 * 1024**3)' 2>&1 | tail -1")
    assert "MemoryError" in res.observation
    res = bash(episode, f"head -c {20 * MiB} /dev/zero > big.bin; echo rc=$?; stat -c %s big.bin")
    assert "File size limit exceeded" in res.observation or "File too large" in res.observation
    assert (episode.workspace / "big.bin").stat().st_size <= 8 * MiB
    # RAM-backed scratch space is capped too (many files, each under the file-size limit)
    res = bash(
        episode,
        "for i in 1 2 3 4; do head -c 6000000 /dev/zero > /dev/shm/f$i; head -c 6000000 /dev/zero > "
        "/tmp/f$i; done 2>&1 | sort -u; du -sbx /dev/shm /tmp",
    )
    assert "No space left on device" in res.observation
    assert all(
        int(line.split()[0]) <= 16 * MiB + 4096
        for line in res.observation.splitlines()
        if line.endswith(("/dev/shm", "/tmp"))
    )


def test_background_processes_do_not_outlive_the_call(episode: Episode):
    nohup, setsid = (f"bg{uuid.uuid4().hex[:8]}" for _ in range(2))
    res = bash(
        episode,
        f"nohup sh -c 'sleep 600; echo {nohup}' >/dev/null 2>&1 & "
        f"setsid sh -c 'ps -o sid= -p $$ > setsid.txt; sleep 600; echo {setsid}' >/dev/null 2>&1 & "
        "sleep 0.5; echo started",
    )
    assert "started" in res.observation and res.error_kind is None
    # the setsid one really ran, in a session of its own (not the command's)
    assert (episode.workspace / "setsid.txt").read_text().strip().isdigit()
    assert episode.trajectory.turns[-1].duration_s < 20  # not the 600 s of the sleeps
    assert not _processes_with(nohup) and not _processes_with(setsid)


def test_sigpipe_behaves_as_in_a_shell(episode: Episode):
    res = bash(episode, "yes | head -n 2; echo ${PIPESTATUS[0]}")
    assert res.observation.startswith("y\ny\n141")  # yes died of SIGPIPE, as it would outside


def test_huge_and_binary_output_is_capped_and_decoded(episode: Episode):
    res = bash(episode, "head -c 50000000 /dev/zero | tr '\\0' a; printf '\\xff\\xfe tail-end'")
    assert len(res.observation.encode()) < 10_000
    assert "bytes of output truncated" in res.observation
    assert "\ufffd" in res.observation and "tail-end" in res.observation


def test_commands_reading_stdin_get_eof(episode: Episode):
    res = bash(episode, "cat; read line; echo read-rc=$?; python -c 'input()' 2>&1 | tail -1")
    assert res.error_kind is None
    assert "read-rc=1" in res.observation and "EOFError" in res.observation


def test_symlink_and_dotdot_escapes_are_rejected(episode: Episode, task_dir: Path):
    bash(episode, f"ln -s {task_dir} escape; ln -s /etc/passwd pw; ln -s / rootlink")
    for path in (
        "escape/gold.patch",
        "pw",
        "../../../etc/passwd",
        "/etc/passwd",
        str(task_dir / "gold.patch"),
        "rootlink/etc",
    ):
        res = call(episode, "view", path=path)
        assert res.error_kind == "path_outside_workspace", (path, res.observation)
    res = call(episode, "create", path="escape/pwned.py", content="x")
    assert res.error_kind == "path_outside_workspace" and not (task_dir / "pwned.py").exists()
    res = call(episode, "str_replace", path="pw", old="root", new="toor")
    assert res.error_kind == "path_outside_workspace"
    # inside the sandbox the link target does not exist either
    res = bash(episode, "cat escape/gold.patch")
    assert "No such file or directory" in res.observation


def test_no_sandbox_is_recorded(task_dir: Path):
    ep = Episode(task_dir, EpisodeConfig(sandbox=SandboxConfig(no_sandbox=True)))
    ep.reset()
    assert ep.trajectory.sandboxed is False
    ep.close()
