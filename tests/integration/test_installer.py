"""cadenza.installer: uv gets pip's settings, installs for real, and a failing uv falls back to pip.

Offline: the package installed is a wheel written here (a wheel is a zip with three metadata files)."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from cadenza import installer


def _wheel(dest: Path, name: str = "cadenza_probe", version: str = "1.0") -> Path:
    """A minimal pure-Python wheel whose module answers ``VALUE = 42``."""
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": b"VALUE = 42\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    wheel = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
        z.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return wheel


def _venv(path: Path) -> str:
    venv.EnvBuilder(with_pip=True).create(path)
    return str(path / "bin" / "python")


def _value(python: str) -> str:
    code = "import cadenza_probe; print(cadenza_probe.VALUE)"
    return subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60).stdout.strip()


def test_pip_settings_reach_uv(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "wheels"))
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "file:///a/simple file:///b/simple")
    settings = installer.pip_settings(sys.executable)
    assert settings["find-links"] == [str(tmp_path / "wheels")]  # the variable overrides pip.conf, as for pip
    assert settings["extra-index-url"] == ["file:///a/simple", "file:///b/simple"]
    cmd = installer.uv_command("uv", "py", ["-q", "--disable-pip-version-check", "x==1"], settings)
    assert cmd[-1] == "x==1" and "-q" not in cmd and "--disable-pip-version-check" not in cmd
    assert cmd[cmd.index("--find-links") + 1] == str(tmp_path / "wheels")
    assert cmd[cmd.index("--index-strategy") + 1] == "unsafe-best-match"  # pip's: best version anywhere


@pytest.mark.slow
def test_uv_installs_and_a_failing_uv_falls_back_to_pip(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    wheel = _wheel(tmp_path)
    if installer.find_uv() is None:
        pytest.skip("uv is not installed here (make installs it into .venv)")
    python = _venv(tmp_path / "a")
    installer.install(python, ["--no-deps", str(wheel)], timeout=300)
    assert _value(python) == "42"
    assert "falling back to pip" not in capfd.readouterr().err

    monkeypatch.setenv(installer.UV_ENV, "/bin/false")  # a uv that always fails
    python = _venv(tmp_path / "b")
    installer.install(python, ["--no-deps", str(wheel)], timeout=300)
    assert _value(python) == "42"
    assert "falling back to pip" in capfd.readouterr().err


@pytest.mark.slow
def test_a_failing_install_raises_after_both_tried(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(installer.UV_ENV, "/bin/false")
    python = _venv(tmp_path / "c")
    with pytest.raises(subprocess.CalledProcessError):
        installer.install(python, ["--no-deps", "--no-index", str(tmp_path / "missing.whl")], timeout=300)
