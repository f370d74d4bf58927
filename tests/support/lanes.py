"""The engine lanes' components (vLLM's engine venv, Ray): skipped with the reason where one is missing,
except under ``make test``, which sets ``CADENZA_REQUIRE_ENGINES=1`` so that a missing engine fails the
run instead of letting CI pass without the engines the product promises."""

from __future__ import annotations

import functools
import importlib.util
import os

REQUIRE_ENV = "CADENZA_REQUIRE_ENGINES"
FIX = {
    "vllm": "python -m cadenza.rl.engines.install (make test runs it)",
    "ray": "pip install -e '.[train,dev]' (Ray comes with the train extra)",
}


@functools.cache
def installed(component: str) -> bool:
    """Whether ``component`` can run here (probed once per test process)."""
    if component == "vllm":
        from cadenza.rl.engines.vllm_server import vllm_installed

        return vllm_installed()
    if component == "ray":
        return importlib.util.find_spec("ray") is not None
    raise ValueError(f"unknown test component {component!r}; known: {sorted(FIX)}")


def engines_required(environ: dict[str, str] | None = None) -> bool:
    return (os.environ if environ is None else environ).get(REQUIRE_ENV, "") not in ("", "0")


def decide(component: str, *, present: bool, required: bool) -> tuple[str, str] | None:
    """``None`` (run), ``("skip", why)`` or ``("fail", why)`` for a test that needs ``component``."""
    if present:
        return None
    why = f"{component} is not installed ({FIX[component]})"
    if required:
        return "fail", f"{why}; {REQUIRE_ENV}=1 (make test) requires every engine lane to run"
    return "skip", why
