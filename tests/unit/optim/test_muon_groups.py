"""muon_param_groups on tiny random HF Qwen3, Qwen3-MoE and DeepSeek-V3 (MLA) models."""

from __future__ import annotations

import pytest
import torch

from cadenza.optim import Muon, assign, muon_param_groups


def _model(kind: str):
    from transformers import AutoModelForCausalLM, DeepseekV3Config, Qwen3Config, Qwen3MoeConfig

    common = dict(hidden_size=64, num_hidden_layers=2, vocab_size=96, max_position_embeddings=64)
    if kind == "qwen3":
        cfg = Qwen3Config(
            **common, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=16
        )
    elif kind == "qwen3_moe":
        cfg = Qwen3MoeConfig(
            **common,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            moe_intermediate_size=32,
            num_experts=8,
            num_experts_per_tok=2,
        )
    else:
        cfg = DeepseekV3Config(
            **common,
            intermediate_size=96,
            moe_intermediate_size=32,
            num_attention_heads=4,
            num_key_value_heads=4,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_shared_experts=1,
            q_lora_rank=32,
            kv_lora_rank=16,
            qk_rope_head_dim=8,
            qk_nope_head_dim=16,
            v_head_dim=12,
            first_k_dense_replace=1,
            n_group=2,
            topk_group=1,
        )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg)


EXPECT = {
    "qwen3": {
        "layers.0.self_attn.q_proj.weight": ("head", 16, 0, None),
        "layers.0.self_attn.k_proj.weight": ("head", 16, 0, None),
        "layers.1.self_attn.o_proj.weight": ("head", 16, 1, None),
        "layers.0.mlp.gate_proj.weight": ("matrix", None, 0, None),
    },
    "qwen3_moe": {
        "layers.0.self_attn.v_proj.weight": ("head", 16, 0, None),
        "layers.0.mlp.experts.gate_up_proj": ("expert", None, 0, (32, 32)),
        "layers.1.mlp.experts.down_proj": ("expert", None, 0, None),
        "layers.0.mlp.gate.weight": ("matrix", None, 0, None),
    },
    "deepseek_v3": {
        "layers.0.self_attn.q_a_proj.weight": ("matrix", None, 0, None),
        "layers.0.self_attn.q_b_proj.weight": ("head", 24, 0, None),
        "layers.1.self_attn.kv_a_proj_with_mqa.weight": ("head", None, 0, (16, 8)),
        "layers.1.self_attn.kv_b_proj.weight": ("head", 28, 0, None),
        "layers.0.self_attn.o_proj.weight": ("head", 12, 1, None),
        "layers.1.mlp.experts.gate_up_proj": ("expert", None, 0, (32, 32)),
        "layers.1.mlp.shared_experts.down_proj.weight": ("matrix", None, 0, None),
        "layers.0.mlp.down_proj.weight": ("matrix", None, 0, None),
    },
}


@pytest.mark.parametrize("kind", ["qwen3", "qwen3_moe", pytest.param("deepseek_v3", marks=pytest.mark.slow)])
def test_assignment_and_training(kind, capsys):
    model = _model(kind)
    rules = assign(model)
    for short, (gran, hd, axis, split) in EXPECT[kind].items():
        r = rules["model." + short]
        assert (r.algorithm, r.granularity, r.head_dim, r.head_axis, r.split_sizes) == (
            "muon",
            gran,
            hd,
            axis,
            split,
        )
    for name, p in model.named_parameters():
        if p.ndim == 1 or "embed_tokens" in name or name.startswith("lm_head"):
            assert rules[name].algorithm == "adamw", name
    groups = muon_param_groups(model, adamw_lr=3e-3, show=True)
    table = capsys.readouterr().out
    assert "expert" in table or kind == "qwen3"
    assert "head" in table
    seen = [id(p) for g in groups for p in g["params"]]
    assert sorted(seen) == sorted(id(p) for p in model.parameters())  # each parameter exactly once
    opt = Muon(groups, lr=0.02)
    ids = torch.randint(0, 96, (4, 16), generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(6):
        loss = model(input_ids=ids, labels=ids).loss
        losses.append(loss.item())
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert losses[-1] < losses[0] - 0.5, losses


def test_non_granular_baseline():
    model = _model("qwen3_moe")
    rules = assign(model, granular=False)
    assert rules["model.layers.0.self_attn.q_proj.weight"].granularity == "matrix"
    assert rules["model.layers.0.mlp.experts.down_proj"].granularity == "expert"  # a 3-D stack is no matrix
