"""The probe behind the ``network`` marker: can ``pip`` reach the package registry?"""

from __future__ import annotations

import functools
import subprocess
import sys

PROBE_PACKAGE = "cachetools"  # the package the task-factory tests build from


@functools.cache
def registry_problem() -> str | None:
    """Why the package registry cannot be used (None: it answers), probed once per session with pip."""
    cmd = [sys.executable, "-m", "pip", "index", "versions", PROBE_PACKAGE]
    cmd += ["--timeout", "10", "--retries", "0", "--disable-pip-version-check"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "pip index timed out after 60 s"
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        return lines[-1] if lines else f"pip index exited {proc.returncode}"
    return None
