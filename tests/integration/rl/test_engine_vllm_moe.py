"""The real vLLM engine (CPU build) on a tiny Qwen3-MoE: stacked HF experts are renamed to the
per-expert names vLLM loads, CPU expert weights are re-packed after each reload, parity holds."""

from __future__ import annotations

import pytest
import torch

from cadenza.rl.engines import make_engine
from cadenza.rl.engines.policy import HFPolicy, SampleRequest, SamplingParams, tiny_qwen3_moe_config
from tests.support.engine_helpers import TOL, check_sync_parity, hf_logprobs, requires_vllm, save
from tests.support.rl_helpers import make_tokenizer

pytestmark = [pytest.mark.slow, pytest.mark.serial, requires_vllm]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    tok = make_tokenizer()
    policy = HFPolicy.from_config(tiny_qwen3_moe_config(len(tok), head_dim=32), seed=0)
    policy.model.eval()
    path = save(policy, tok, tmp_path_factory.mktemp("moe"))
    engine = make_engine("vllm", model=str(path), max_model_len=512, request_timeout_s=120, sync_timeout_s=60)
    try:
        yield tok, policy, engine
    finally:
        engine.close()
        torch.set_num_threads(threads)


def test_sampled_logprobs_are_the_trainers(setup):
    tok, policy, engine = setup
    prompt = tok.encode("Make the counter reach 3, then submit.", add_special_tokens=False)
    params = SamplingParams(max_new_tokens=16, temperature=0.8, top_k=20)
    for s in engine.sample(SampleRequest([prompt] * 4, params, torch.Generator().manual_seed(0))):
        ref = hf_logprobs(policy, prompt + s.token_ids, temperature=0.8)[len(prompt) - 1 :]
        # top-k renormalises: the engine's processed log-prob is the trainer's minus log of the kept mass
        with torch.no_grad():
            logits = policy.model(torch.tensor([prompt + s.token_ids])).logits[0, len(prompt) - 1 : -1] / 0.8
        kept = logits.topk(20, dim=-1).values.logsumexp(-1) - logits.logsumexp(-1)
        assert float((torch.tensor(s.logprobs) - (ref - kept)).abs().max()) <= TOL


def test_weight_sync_parity_moe(setup):
    tok, policy, engine = setup
    seqs = [list(range(3, 70)), tok.encode("counter = 1 2 3 error: tool not found", add_special_tokens=False)]
    check_sync_parity(engine, policy, seqs, steps=2, lr=0.1)
