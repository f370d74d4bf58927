"""Run Python with the ``train`` extra's packages made unimportable, as after ``pip install cadenza``
without ``cadenza[train]``: what runs this way needs no torch."""

from __future__ import annotations

import subprocess
import sys

TRAIN_ONLY = ("torch", "transformers", "tokenizers", "safetensors", "numpy", "matplotlib")

PRELUDE = f"""
import importlib.abc, sys
class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {TRAIN_ONLY!r}:
            msg = f"No module named {{name!r}} (blocked: cadenza[train] not installed)"
            raise ModuleNotFoundError(msg, name=name)
        return None
sys.meta_path.insert(0, _NotInstalled())
"""


def run_torchless(code: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -c code args...`` with the blocker installed first."""
    return subprocess.run(
        [sys.executable, "-c", PRELUDE + code, *args], capture_output=True, text=True, timeout=timeout
    )


def cadenza_torchless(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The ``cadenza`` CLI with ``args``, torch blocked."""
    code = "from cadenza.cli import main\nsys.argv = ['cadenza', *sys.argv[1:]]\nmain()\n"
    return run_torchless(code, *args, timeout=timeout)
