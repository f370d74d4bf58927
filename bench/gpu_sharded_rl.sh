#!/usr/bin/env bash
# A sharded RL run with engine sync on ONE GPU: the policy on FSDP2 in a one-rank group
# (CADENZA_FORCE_SHARDING=1), a tiny Qwen3-MoE, the vLLM engine on the same GPU synced from the shards
# through vLLM's native CUDA-IPC transfer, rollout.sync_probe_tol checking every sync.
# Prints the ONE JSON object of bench/gpu_sharded_rl.py; exit 1 if the run fails.
#   bash bench/gpu_sharded_rl.sh              # 2 steps
#   bash bench/gpu_sharded_rl.sh --steps 3
# Two ranks cannot share one GPU under NCCL; on a machine with two GPUs the same config runs under
# torchrun --nproc-per-node 2 (drop CADENZA_FORCE_SHARDING). The CPU analogue (--device cpu, worker
# transfer) is tests/integration/rl/test_gpu_sharded_script.py.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
test -x .venv/bin/python || "$PY" -m venv .venv
.venv/bin/python -m pip install -q -e '.[dev]'
# the engine venv with the CUDA vLLM build, and vLLM beside the trainer (the IPC transfer's trainer side)
.venv/bin/python -m cadenza.rl.engines.install --cuda yes >&2
.venv/bin/python -m cadenza.rl.engines.install --same-env >&2
nvidia-smi -L >&2
exec timeout 3600 .venv/bin/python bench/gpu_sharded_rl.py --device cuda "$@"
