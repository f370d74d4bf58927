"""Tiny random HF MoE models (Qwen3-MoE, DeepSeek-V3) and a float64 single-process reference."""

from __future__ import annotations

import copy

import torch

# What the ranks of every distributed test import, for ``cadenza.testing.spawn(..., preload=PRELOAD)``.
# The forkserver is started once per process with the first preload it is given, so every test passes
# this same union: whichever runs first, no later world-8 spawn has each rank import transformers.
PRELOAD = (
    "torch",
    "torch.distributed.tensor",
    "torch.distributed.fsdp",
    "transformers",
    "transformers.models.qwen3_moe.modeling_qwen3_moe",
    "transformers.models.deepseek_v3.modeling_deepseek_v3",
    "tests.support.tiny_moe",
    "tests.support.pretrain_fixtures",
)


def tiny_model(kind: str, seed: int = 0):
    """hidden 64, 2 layers, 8 experts, float32; routers initialised wide so top-k has no near-ties."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, Qwen3MoeForCausalLM

    from cadenza.rl.engines.policy import tiny_qwen3_moe_config

    torch.manual_seed(seed)
    if kind == "qwen3_moe":
        cfg = tiny_qwen3_moe_config(96, intermediate_size=96, max_position_embeddings=128)
    elif kind in ("deepseek_v3", "deepseek_v3_starved"):
        # Layer 0 dense MLP, layer 1 MoE with a shared expert, grouped routing and a score-correction bias.
        cfg = DeepseekV3Config(
            vocab_size=96,
            hidden_size=64,
            intermediate_size=96,
            moe_intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            n_routed_experts=8,
            n_shared_experts=1,
            num_experts_per_tok=2,
            n_group=2,
            topk_group=1,
            first_k_dense_replace=1,
            q_lora_rank=32,
            kv_lora_rank=16,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=16,
            max_position_embeddings=128,
        )
    else:
        raise ValueError(kind)
    cfg._attn_implementation = "sdpa"
    cfg._experts_implementation = "eager"  # the reference runs in float64, which grouped_mm lacks
    model = (Qwen3MoeForCausalLM if kind == "qwen3_moe" else DeepseekV3ForCausalLM)(cfg).float()
    starved = kind.endswith("_starved")  # experts 4..7 never chosen: EP ranks owning them get no tokens
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("gate.weight"):
                p.normal_(0.0, 0.5)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn_like(b) * 0.1)
                if starved:
                    b[4:] = -10.0
    return model


def batches(n: int, batch: int, seq_len: int, vocab: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n, batch, seq_len), generator=g)


def reference(model, data: torch.Tensor) -> tuple[list[float], dict[str, torch.Tensor]]:
    """float64 single process: per-batch losses and gradients of their mean."""
    ref = copy.deepcopy(model).double()
    ref.zero_grad()
    losses = [ref(input_ids=b, labels=b).loss for b in data]
    torch.stack(losses).mean().backward()
    return [float(v) for v in losses], {n: p.grad.detach().clone() for n, p in ref.named_parameters()}
