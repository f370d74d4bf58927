"""Lazy packages (cadenza.lazy): config modules import without torch, so a bad config or flag is one line
in well under a second; a function named like its submodule stays the function whatever the import order."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import cadenza.optim.config, cadenza.pretrain.config, cadenza.rl.config, cadenza.parallel.dims
print("torch" in sys.modules)
"""

ORDER = """
import types
import cadenza.optim.newton_schulz, cadenza.parallel.parallelize  # the submodules first
from cadenza.optim import newton_schulz, Muon
from cadenza.parallel import parallelize, ParallelDims
import cadenza.optim as optim
assert callable(newton_schulz) and not isinstance(newton_schulz, types.ModuleType), newton_schulz
assert callable(parallelize) and not isinstance(parallelize, types.ModuleType), parallelize
assert optim.newton_schulz is newton_schulz
assert Muon.__name__ == "Muon" and ParallelDims.__name__ == "ParallelDims"
try:
    optim.no_such_name
except AttributeError as exc:
    assert "no_such_name" in str(exc)
else:
    raise AssertionError("a missing name must raise AttributeError")
print("ok")
"""


def _run(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


def test_config_modules_import_without_torch():
    assert _run(PROBE) == "False"


def test_a_function_named_like_its_submodule_stays_the_function():
    assert _run(ORDER) == "ok"
