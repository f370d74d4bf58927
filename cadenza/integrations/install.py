"""Install mini-swe-agent and swebench into their own venv (``<venv>/ecosystem``).

``pip install mini-swe-agent`` into the trainer's venv would downgrade ``python-dateutil`` (4.0 -> 2.9)
and add ~50 packages (litellm, datasets, boto3, textual); ``swebench`` adds docker, modal and pandas.
So, like the vLLM engine (:mod:`cadenza.rl.engines.install`), they get a venv of their own with
cadenza's torch-free core dependencies beside them; cadenza itself is found through ``PYTHONPATH``
(:func:`ecosystem_env`), so the venv never holds a stale copy of it::

    python -m cadenza.integrations.install            # <this venv>/ecosystem
    python -m cadenza.integrations.install --venv DIR

Re-running is cheap: a venv whose packages already import at supported versions is kept.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import cadenza
from cadenza import installer
from cadenza.errors import CadenzaError

#: Supported ranges (the adapter checks them at run time: the Environment/Agent API of 2.x).
MINISWE = "mini-swe-agent>=2.4,<3"
SWEBENCH = "swebench>=5.0,<6"
REPO_ROOT = Path(cadenza.__file__).resolve().parent.parent
ENV_VAR = "CADENZA_ECOSYSTEM_VENV"
INSTALL_HINT = "run `python -m cadenza.integrations.install` (or `make .venv/.ecosystem`)"


def default_venv() -> Path:
    """``$CADENZA_ECOSYSTEM_VENV``, else ``<this interpreter's venv>/ecosystem``."""
    return Path(os.environ.get(ENV_VAR) or Path(sys.prefix) / "ecosystem")


def ecosystem_python(venv: Path | None = None) -> str:
    """The ecosystem venv's python; one line naming the installer when it is missing."""
    python = (venv or default_venv()) / "bin" / "python"
    if not python.exists():
        raise CadenzaError(f"the ecosystem venv {python.parent.parent} does not exist; {INSTALL_HINT}")
    return str(python)


def ecosystem_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a process in the ecosystem venv: this cadenza first on ``sys.path``."""
    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    # litellm's cost table from its own wheel, never fetched from the network at import
    quiet = {"MSWEA_SILENT_STARTUP": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONPATH": path}
    return {**os.environ, **quiet, **(extra or {})}


def core_dependencies() -> list[str]:
    """cadenza's torch-free dependencies, from pyproject.toml (the sandbox, grader and monitor need them)."""
    data = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    return list(data["project"]["dependencies"])


def _works(python: str) -> bool:
    code = (
        "import importlib.metadata as m, packaging.specifiers as s\n"
        f"for req in {[MINISWE, SWEBENCH]!r}:\n"
        "    name, spec = req.split('>', 1)[0], '>' + req.split('>', 1)[1]\n"
        "    assert m.version(name) in s.SpecifierSet(spec), req\n"
        "import minisweagent, swebench.harness.log_parsers, libcst, typer\n"
    )
    env = ecosystem_env()
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    return proc.returncode == 0


def install(venv: Path | None = None) -> str:
    """Create (or complete) the ecosystem venv; return its python."""
    venv = venv or default_venv()
    python = str(venv / "bin" / "python")
    if Path(python).exists() and _works(python):
        print(f"mini-swe-agent and swebench already work in {venv}; skipped", flush=True)
        return python
    if not Path(python).exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=600)
    installer.install(python, ["packaging", MINISWE, SWEBENCH, *core_dependencies()], timeout=1800)
    if not _works(python):
        raise SystemExit(f"mini-swe-agent/swebench were installed but do not import in {python}")
    return python


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", type=Path, default=None, help="target venv (default: <this venv>/ecosystem)")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    install(args.venv)
    print(f"cadenza ecosystem install: done in {time.monotonic() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
