"""The task factory runs third-party code only in bubblewrap (issue 13 item 5).

A source's ``setup.py`` (run by pip for metadata and installs), the baseline's plain and coverage runs
and the environment probes cannot write outside their own directories, and a test run has no network;
only pip's install phase reaches the network, and there only the registry. Each attack is first shown
to work on the host.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import uuid
import venv
from pathlib import Path

import pytest

from cadenza.sandbox import SandboxConfig
from cadenza.tasks.deletion.baseline import run_baseline
from cadenza.tasks.sources.deps import discover_requirements
from cadenza.tasks.sources.fetch import fetch_source
from cadenza.tasks.sources.isolate import run_python
from cadenza.tasks.sources.runner import pytest_args_for, run_pytest
from cadenza.tasks.sources.venv import _pip, ensure_base_env, make_task_env
from tests.support.tasks_helpers import make_repo, shared_env_cache

SETUP_PY = """\
import pathlib
from setuptools import setup

for target in {targets!r}:
    try:
        pathlib.Path(target).write_text("escaped")
    except OSError:
        pass
setup(name="evilsetup", version="1.0", py_modules=["evilsetup"], install_requires={requires!r})
"""

WRITER_TEST = """\
import pathlib

def test_writes_outside():
    for target in {targets!r}:
        try:
            pathlib.Path(target).write_text("escaped")
        except OSError:
            pass
"""


def _targets(tmp_path: Path) -> list[Path]:
    """Places outside every build directory: the host's home and a directory next to the build."""
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    return [Path.home() / f".cadenza-escape-{uuid.uuid4().hex}", outside / "marker"]


def _evil_project(root: Path, targets: list[Path], requires: list[str]) -> Path:
    root.mkdir(parents=True)
    (root / "setup.py").write_text(SETUP_PY.format(targets=[str(t) for t in targets], requires=requires))
    (root / "evilsetup.py").write_text("VALUE = 1\n")
    return root


def _assert_unwritten(targets: list[Path]) -> None:
    escaped = [t for t in targets if t.exists()]
    for t in escaped:
        t.unlink()
    assert not escaped, f"third-party code wrote outside its sandbox: {escaped}"


def test_setup_py_writes_on_the_host_when_run_there(tmp_path: Path) -> None:
    """The control: the attack is real (the same setup.py, run unconfined, writes both markers)."""
    targets = [tmp_path / "a", tmp_path / "b"]
    proj = _evil_project(tmp_path / "proj", targets, [])
    subprocess.run([sys.executable, "setup.py", "--name"], cwd=proj, capture_output=True, timeout=120)
    assert all(t.read_text() == "escaped" for t in targets)


@pytest.mark.network  # pip's isolated metadata build fetches setuptools
def test_metadata_build_runs_setup_py_only_in_the_sandbox(tmp_path: Path) -> None:
    targets = _targets(tmp_path)
    proj = _evil_project(tmp_path / "proj", [*targets, tmp_path / "proj" / "in-source"], ["marker-dep>=1"])
    reqs = discover_requirements(proj, ["evilsetup"])
    assert reqs.runtime == ["marker-dep>=1"], reqs  # setup.py ran: its metadata came back
    assert "pip metadata" in reqs.sources
    _assert_unwritten([*targets, proj / "in-source"])  # the source tree is not written either
    assert not list(proj.glob("*.egg-info"))


@pytest.mark.network  # pip's isolated build fetches setuptools
def test_pip_install_of_an_sdist_writes_only_its_venv(tmp_path: Path) -> None:
    targets = _targets(tmp_path)
    env = tmp_path / "env"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env)
    proj = _evil_project(env / "proj", targets, [])  # a local path pip can read: inside the venv
    proc = _pip(env / "bin" / "python", "install", "-q", str(proj))
    assert proc.returncode == 0, proc.stderr[-800:]
    site = next((env / "lib").glob("python3*/site-packages"))
    assert (site / "evilsetup.py").read_text() == "VALUE = 1\n"
    _assert_unwritten(targets)


@pytest.mark.network  # the base env installs its tooling with pip
def test_baseline_and_coverage_runs_cannot_write_outside(tmp_path_factory, tmp_path: Path) -> None:
    targets = _targets(tmp_path)
    extra = {"test_writer.py": WRITER_TEST.format(targets=[str(t) for t in targets])}
    src = make_repo(tmp_path / "r", extra_tests=extra)
    info = fetch_source(str(src), tmp_path / "copy")
    base = ensure_base_env(info, shared_env_cache(tmp_path_factory))
    py = make_task_env(base, info.root, tmp_path / "env")
    baseline, fmap = run_baseline(
        info, py, info.root, pytest_args=pytest_args_for(info.root), timeout_s=300, per_test_timeout_s=30
    )
    assert "tests/test_writer.py::test_writes_outside" in baseline.passing
    covering = {c.qualname: c.tests for c in fmap.candidates}  # the sandboxed coverage run measured
    assert covering["minilib.textutil.shout"] == {"tests/test_text.py::test_shout"}
    _assert_unwritten(targets)
    for target in targets:  # an environment probe (imports, option listing) is confined the same way
        probe = run_python(
            py, f"import pathlib; pathlib.Path({str(target)!r}).write_text('x')", cwd=info.root
        )
        assert probe.returncode != 0 and "Error" in probe.stderr, probe
    _assert_unwritten(targets)


NET_TEST = """\
import socket

def test_reaches_the_registry():
    socket.create_connection(("pypi.org", 443), timeout=10).close()
"""


def _host_has_network() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=10).close()
        return True
    except OSError:
        return False


@pytest.mark.network  # the workspace's test connects to pypi.org
def test_test_runs_have_no_network_and_only_the_install_phase_has(tmp_path: Path) -> None:
    if not _host_has_network():
        pytest.skip("the host cannot reach pypi.org, so a denied connection proves nothing here")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "test_net.py").write_text(textwrap.dedent(NET_TEST))
    python = Path(sys.prefix) / "bin" / "python"
    node = "test_net.py::test_reaches_the_registry"
    kw = dict(timeout_s=120, per_test_timeout_s=60, plugins=[])
    assert run_pytest(python, ws, [node], sandbox=SandboxConfig(), **kw).outcome(node) == "failed"
    shared = run_pytest(python, ws, [node], sandbox=SandboxConfig(network=True), **kw)
    assert shared.outcome(node) == "passed", shared.output_tail  # the switch is what denies it


REACH = """\
import json, socket, sys, urllib.request
port, other = int(sys.argv[1]), int(sys.argv[2])
def direct(p):
    try:
        socket.create_connection(("127.0.0.1", p), timeout=5).close()
        return "reached"
    except OSError:
        return "refused"
def tunnel(p):
    proxy = urllib.request.getproxies()["https"].rsplit(":", 1)
    c = socket.create_connection((proxy[0].split("//")[1], int(proxy[1])), timeout=5)
    c.sendall(b"CONNECT 127.0.0.1:%d HTTP/1.1\\r\\n\\r\\n" % p)
    return c.recv(64).split(b"\\r\\n")[0].decode()
print(json.dumps({"direct": direct(other), "registry": tunnel(port), "other": tunnel(other)}))
"""


def test_the_install_phase_reaches_the_registry_and_no_other_host_service(tmp_path: Path) -> None:
    """pip's sandbox has its own network namespace: a service on the host's loopback is out of reach,
    and the relay's proxy lets through only the registry (here a loopback stand-in for it)."""
    from cadenza.sandbox.egress import RELAY_PROGRAM, RegistryProxy
    from cadenza.tasks.sources.isolate import INSTALL, run_sandboxed

    servers = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    (port, other) = (s.getsockname()[1] for s in servers)
    ws = tmp_path / "ws"
    ws.mkdir()
    with RegistryProxy({("127.0.0.1", port)}, timeout_s=10) as proxy:
        cmd = [sys.executable, "-I", "-S", RELAY_PROGRAM, proxy.socket_path, "--",
               sys.executable, "-I", "-c", REACH, str(port), str(other)]  # fmt: skip
        kw = dict(workspace=ws, env_dir=Path(sys.prefix), readable=[RELAY_PROGRAM], timeout_s=120)
        res = run_sandboxed(cmd, config=INSTALL, writable=[Path(proxy.socket_dir)], **kw)
        assert res.returncode == 0, res.stderr
        got = json.loads(res.stdout)
        assert got == {"direct": "refused", "registry": "HTTP/1.1 200 Connection established",
                       "other": "HTTP/1.1 403 Forbidden"}, got  # fmt: skip
        shared = run_sandboxed(cmd, config=SandboxConfig(network=True, persistent=False),
                               writable=[Path(proxy.socket_dir)], **kw)  # fmt: skip
        assert json.loads(shared.stdout)["direct"] == "reached"  # the namespace is the wall
    for s in servers:
        s.close()
