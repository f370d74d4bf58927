"""vLLM's native weight transfer on a real GPU (CUDA IPC, trainer and engine on one device): after a
push, engine log-probs equal the trainer's. Runs where CUDA and vLLM are importable (bench/gpu.sh runs
it in the engine venv); elsewhere there is nothing to run it on."""

from __future__ import annotations

import pytest
import torch

from cadenza.rl.engines import make_engine
from cadenza.rl.engines.gpu_sync import ModuleWeights
from cadenza.rl.engines.policy import HFPolicy, tiny_qwen3_config
from tests.support.engine_helpers import check_sync_parity, save
from tests.support.rl_helpers import make_tokenizer

pytestmark = [
    pytest.mark.serial,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


class _Native:
    """The parity helper syncs named_parameters(); the native path takes ModuleWeights instead."""

    def __init__(self, engine, module):
        self.engine, self.module = engine, module

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def sync_weights(self, named, *, version):
        self.engine.sync_weights(ModuleWeights(self.module), version=version)


def test_ipc_push_parity(tmp_path):
    tok = make_tokenizer()
    policy = HFPolicy.from_config(tiny_qwen3_config(len(tok), head_dim=32, tie_word_embeddings=True), seed=0)
    path = save(policy, tok, tmp_path / "m")
    policy.model.to("cuda")
    policy.device = torch.device("cuda")
    engine = make_engine(
        "vllm", model=str(path), weight_transfer="ipc", max_model_len=512, gpu_memory_utilization=0.3
    )
    try:
        seqs = [list(range(5, 60))]
        check_sync_parity(_Native(engine, policy.model), policy, seqs, steps=2, lr=0.1)
    finally:
        engine.close()
