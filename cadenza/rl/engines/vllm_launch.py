"""Run vLLM's OpenAI API server with its engine-core process forked instead of spawned (CPU build).

vLLM's CPU platform forces ``spawn`` for every process it starts, so the engine core re-imports vLLM,
torch, transformers and the whole API-server module (``__mp_main__``) that the API server has just
imported: 10-25 s of CPU per start. The API server has run no torch kernel when it starts the engine
core (no OpenMP pool to inherit), and vLLM forks this same process on GPU machines by default, so a fork
is safe here and the child starts with everything already imported. Runs in the engine venv.
"""

from __future__ import annotations

import multiprocessing
import runpy
import sys

SERVER = "vllm.entrypoints.openai.api_server"


def _fork_engine_core() -> None:
    import vllm.v1.engine.utils as engine_utils

    engine_utils.get_mp_context = lambda: multiprocessing.get_context("fork")


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] != SERVER:
        raise SystemExit(f"usage: python -m cadenza.rl.engines.vllm_launch {SERVER} ARGS...")
    _fork_engine_core()
    sys.argv = [sys.argv[0], *sys.argv[2:]]
    runpy.run_module(SERVER, run_name="__main__", alter_sys=True)
