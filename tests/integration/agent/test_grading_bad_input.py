"""Bad input to grading: binary or mis-encoded source, a huge file, an import that never returns, a test
process that kills itself or closes every descriptor. Each episode is graded (not resolved, the reason
recorded), the next grade is unaffected, and nothing of the task on the host changes."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from cadenza.agent.grading.grade import grade
from cadenza.agent.grading.policy import Defences
from cadenza.agent.toytask import OPS_REMOVED


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(root)).encode() + p.read_bytes())
    return h.hexdigest()


def _ws(task_dir: Path, tmp_path: Path, files: dict[str, bytes]) -> Path:
    ws = tmp_path / "agent"
    shutil.rmtree(ws, ignore_errors=True)
    shutil.copytree(task_dir / "workspace", ws)
    for rel, data in files.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_bytes(data)
    return ws


def _gold_resolves(task_dir: Path, tmp_path: Path) -> None:
    ws = tmp_path / "gold"
    shutil.rmtree(ws, ignore_errors=True)
    shutil.copytree(task_dir / "workspace", ws)
    subprocess.run(["git", "apply", str(task_dir / "gold.patch")], cwd=ws, check=True, timeout=60)
    assert grade(task_dir, ws).resolved is True


CLAMP = "def clamp(x, lo, hi):\n"
UNCHECKED = Defences(capability_check=False)  # so that the code runs and the runner meets it


KILLS = {
    "calc/ops.py": (OPS_REMOVED + "\n\nimport os\n\n\n" + CLAMP + "    os.kill(os.getpid(), 9)\n").encode()
}
CLOSES = {
    "calc/ops.py": (OPS_REMOVED + "\n\nimport os\n\n\n" + CLAMP + "    os.closerange(0, 65536)\n").encode()
}


@pytest.mark.parametrize(
    "name,files,defences,reason",
    [
        ("binary_source", {"calc/blob.py": b"\x00\xff\xfe\x89PNG\r\n\x1a\n" * 64}, None, "cannot be decoded"),
        ("mis_encoded", {"calc/ops.py": b"x = 1\ny = '\xff\xfe'\n"}, None, "does not decode"),
        ("huge_file", {"calc/big.py": b"X = 1\n" * 400_000}, None, "limit"),
        ("import_never_returns", {"calc/__init__.py": b"while True:\n    pass\n"}, None, "timed out"),
        # with every defence on, the capability check refuses the change before it runs
        ("kills_itself", KILLS, None, "signals (os.kill)"),
        ("closes_every_descriptor", CLOSES, None, "raw file descriptors (os.closerange)"),
        # with it off, the runner meets the code: the process dies before reporting anything
        ("kills_itself_unchecked", KILLS, UNCHECKED, "exit"),
        ("closes_every_descriptor_unchecked", CLOSES, UNCHECKED, "exit"),
    ],
)
def test_bad_input_is_graded_and_changes_nothing(task_dir, tmp_path, name, files, defences, reason):
    before = _digest(task_dir)
    result = grade(task_dir, _ws(task_dir, tmp_path, files), run_timeout_s=20, defences=defences)
    assert result.resolved is False and result.f2p_passed == 0
    recorded = " ".join([*result.capabilities, *result.tampering])
    if reason == "timed out":
        assert result.timed_out is True
    elif reason == "exit":
        # the reason is recorded: a non-zero exit status and every fail-to-pass node never reported
        assert result.exit_code not in (0, None), result
        f2p = [n for n in result.tests if "clamp" in n]
        assert f2p and all(result.tests[n] == "missing" for n in f2p), result.tests
    else:
        assert reason in recorded, recorded
        if defences is None and name in ("kills_itself", "closes_every_descriptor"):
            assert set(result.tests.values()) == {"blocked"}, result.tests
    assert _digest(task_dir) == before
    _gold_resolves(task_dir, tmp_path)  # the next grade is unaffected
