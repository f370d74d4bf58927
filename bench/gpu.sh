#!/usr/bin/env bash
# Rollout-engine benchmark on a GPU machine: installs the CUDA vLLM build into the engine venv and runs
# bench/rollout.py with the hf engine and the trainer copy on the GPU. Prints the same ONE JSON object.
#   bash bench/gpu.sh                 # tiny model + SmolLM2-135M
#   MODELS=smollm2 bash bench/gpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
test -x .venv/bin/python || "$PY" -m venv .venv
.venv/bin/python -m pip install -q -e '.[dev]'
.venv/bin/python -m cadenza.rl.engines.install --cuda yes >&2
nvidia-smi -L >&2
# the native GPU weight transfer (CUDA IPC) needs vLLM beside the trainer: run its test in the engine venv
.venv/vllm/bin/python -m pip install -q pytest pytest-timeout
PYTHONPATH=. .venv/vllm/bin/python -m pytest -q -p no:cacheprovider tests/gpu >&2 || echo "gpu tests failed (see above)" >&2
exec .venv/bin/python bench/rollout.py --device cuda --models "${MODELS:-tiny,smollm2}" "$@"
