"""The GPU weight-sync path (vLLM's native NCCL / IPC transfer) as far as a CPU machine can check it:
metadata agrees with the stream (vLLM's own WeightSource checker, in the engine venv), the server flag
parses with the installed vLLM, and asking for it without CUDA is a one-line error."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from cadenza.errors import CadenzaError
from cadenza.rl.engines.gpu_sync import ModuleWeights, NativeSyncConfig, NativeWeightSync, server_args
from cadenza.rl.engines.policy import HFPolicy, tiny_qwen3_moe_config
from cadenza.rl.engines.vllm_server import _probe, engine_python

ROOT = str(Path(__file__).resolve().parents[3])
needs_engine_venv = pytest.mark.skipif(not _probe(engine_python()), reason="no vLLM engine venv installed")


def test_metadata_matches_the_stream_without_gathering():
    weights = ModuleWeights(HFPolicy.from_config(tiny_qwen3_moe_config(64), seed=0).model)
    meta = weights.metadata()
    stream = [(n, t.dtype, tuple(t.shape)) for n, t in weights]
    assert meta == stream
    assert any(".experts.3.down_proj.weight" in n for n, _, _ in meta)
    half = ModuleWeights(weights.module, dtype=torch.bfloat16)
    assert {d for _, d, _ in half.metadata()} == {torch.bfloat16}


def test_native_sync_needs_cuda_and_a_known_backend():
    with pytest.raises(CadenzaError, match="backend must be one of"):
        server_args("gloo")
    with pytest.raises(CadenzaError, match="world_size"):
        NativeSyncConfig(world_size=1)
    if not torch.cuda.is_available():
        weights = ModuleWeights(torch.nn.Linear(2, 2))
        with pytest.raises(CadenzaError, match="needs CUDA"):
            NativeWeightSync("http://127.0.0.1:1", weights, NativeSyncConfig())


CHECK = """
import json, sys, torch
from vllm.engine.arg_utils import EngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser
from cadenza.rl.engines.gpu_sync import ModuleWeights, weight_source
from cadenza.rl.engines.policy import HFPolicy, tiny_qwen3_moe_config
argv = ["--model", "x", *json.loads(sys.argv[1])]
args = EngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(argv)
src = weight_source(ModuleWeights(HFPolicy.from_config(tiny_qwen3_moe_config(64), seed=0).model))
n = sum(len(names) for names, tensors in src.iter_groups())  # vLLM checks stream order against metadata
print(json.dumps({"backend": json.loads(args.weight_transfer_config)["backend"]
                  if isinstance(args.weight_transfer_config, str) else args.weight_transfer_config.backend,
                  "tensors": n, "meta": len(src.metadata())}))
"""


@needs_engine_venv
def test_weight_source_and_server_flag_with_the_installed_vllm():
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run(
        [engine_python(), "-c", CHECK, json.dumps(server_args("nccl"))],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["backend"] == "nccl" and res["tensors"] == res["meta"] > 0
