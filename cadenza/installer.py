"""Install packages into a venv with uv when it is there (about 10x faster than pip), else with pip.

``make demo`` / ``make test`` build three venvs on a fresh machine (the trainer's, the vLLM engine's and
the ecosystem's); with pip that was about six of CI's minutes, most of it unpacking the same torch wheel
twice and pip's own start-up. uv installs from a shared cache by hard links. It does not read pip's
configuration, so the settings this machine gives pip (``pip config list``: find-links, index URLs,
constraints, the CA bundle) are passed to it explicitly, and its index strategy is pip's (best version
across all indexes). Any uv failure falls back to pip with one line, so uv can only make an install
faster, never break it. Stdlib only: the Makefile runs it before cadenza's dependencies exist::

    python -m cadenza.installer --python .venv/bin/python -- -e '.[train,dev]'
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

#: pip settings with a uv flag of the same meaning (each value may list several, space-separated).
_FLAGS = {
    "find-links": "--find-links",
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "constraint": "--constraint",
}
NO_UV_ENV = "CADENZA_NO_UV"  # set to 1 to install with pip only
UV_ENV = "CADENZA_UV"  # the uv executable to use (default: beside this interpreter, else on PATH)


def find_uv() -> str | None:
    """$CADENZA_UV, uv beside this interpreter (``pip install uv`` in the venv), else on PATH; None
    under CADENZA_NO_UV=1."""
    if os.environ.get(NO_UV_ENV, "") not in ("", "0"):
        return None
    if os.environ.get(UV_ENV):
        return os.environ[UV_ENV]
    here = Path(sys.executable).parent / "uv"
    return str(here) if here.exists() else shutil.which("uv")


def pip_settings(python: str) -> dict[str, list[str]]:
    """pip's effective settings that uv understands, from ``pip config list`` (its files and the PIP_*
    variables, which override them as they do for pip)."""
    try:
        out = subprocess.run(
            [python, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    found: dict[str, dict[str, list[str]]] = {}
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        section, _, name = key.rpartition(".")
        if sep and name in (*_FLAGS, "cert"):
            found.setdefault(name, {})[section] = shlex.split(value.strip().strip("'\""))
    # pip's precedence: a PIP_* variable over the [install] section over [global]
    rank = {":env:": 0, "install": 1, "global": 2}
    return {
        name: by_section[min(by_section, key=lambda sec: rank.get(sec, 3))]
        for name, by_section in found.items()
    }


def uv_command(uv: str, python: str, args: list[str], settings: dict[str, list[str]]) -> list[str]:
    """``uv pip install`` with pip's settings; ``-q`` and pip-only flags of ``args`` are dropped."""
    cmd = [uv, "pip", "install", "--quiet", "--python", python, "--index-strategy", "unsafe-best-match"]
    for name, flag in _FLAGS.items():
        for value in settings.get(name, []):
            cmd += [flag, value]
    skip = {"-q", "--quiet", "--disable-pip-version-check", "--no-warn-script-location"}
    return cmd + [a for a in args if a not in skip]


def install(python: str, args: list[str], *, timeout: float = 1800) -> None:
    """``pip install ARGS`` into ``python``'s environment, by uv when it is there and works."""
    uv = find_uv()
    if uv is not None:
        settings = pip_settings(python)
        env = dict(os.environ)
        if settings.get("cert"):
            env.setdefault("SSL_CERT_FILE", settings["cert"][0])
        cmd = uv_command(uv, python, args, settings)
        print("+", shlex.join(cmd), flush=True)
        try:
            if subprocess.run(cmd, env=env, timeout=timeout).returncode == 0:
                return
        except (OSError, subprocess.TimeoutExpired):
            pass
        print("uv could not install this; falling back to pip", file=sys.stderr, flush=True)
    cmd = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *args]
    print("+", shlex.join(cmd), flush=True)
    subprocess.run(cmd, check=True, timeout=timeout)


def uninstall(python: str, names: list[str], *, timeout: float = 600) -> None:
    """Remove installed distributions (pip: uv's uninstall gains nothing for a few packages)."""
    cmd = [python, "-m", "pip", "uninstall", "-q", "-y", *names]
    print("+", shlex.join(cmd), flush=True)
    subprocess.run(cmd, check=True, timeout=timeout)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=sys.executable, help="the target environment's python")
    ap.add_argument("args", nargs="+", help="pip install arguments (after --)")
    ns = ap.parse_args(argv)
    try:
        install(ns.python, ns.args)
    except subprocess.CalledProcessError as e:
        msg = f"error: installing {' '.join(ns.args)} failed (exit {e.returncode}); see the output above"
        raise SystemExit(msg) from None


if __name__ == "__main__":
    main()
