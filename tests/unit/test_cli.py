import subprocess
import sys


def test_help_lists_commands():
    out = subprocess.run(
        [sys.executable, "-m", "cadenza", "--help"], capture_output=True, text=True, check=True
    )
    assert "demo" in out.stdout


def test_user_error_is_one_line(tmp_path):
    import pytest

    from cadenza.errors import CadenzaError
    from cadenza.tasks.records.task import load_task

    with pytest.raises(CadenzaError, match="not a task directory"):
        load_task(tmp_path)
