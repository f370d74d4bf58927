"""What the trainer is built from: the policy, the optimizer, the loss settings, and the resume check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from cadenza.errors import CadenzaError
from cadenza.rl.config import TrainConfig


def build_policy(cfg: TrainConfig) -> tuple[Any, Any]:
    """Tokenizer + :class:`HFPolicy` from ``[model]``: a local HF directory, or random init."""
    from cadenza.rl.engines.policy import HFPolicy, tiny_qwen3_config, tiny_qwen3_moe_config
    from cadenza.rl.text.chat import load_tokenizer

    m = cfg.model
    tokenizer = load_tokenizer(m.tokenizer or m.path)
    if m.path:
        policy = HFPolicy.from_pretrained(m.path, dtype=m.dtype, device=m.device)
    else:
        common = dict(
            hidden_size=m.hidden_size,
            num_hidden_layers=m.num_layers,
            num_attention_heads=m.num_heads,
            num_key_value_heads=m.num_kv_heads,
            head_dim=m.hidden_size // m.num_heads,
        )
        if m.arch == "qwen3_moe":
            conf = tiny_qwen3_moe_config(
                len(tokenizer),
                moe_intermediate_size=m.intermediate_size,
                num_experts=m.num_experts,
                num_experts_per_tok=m.experts_per_token,
                **common,
            )
        else:
            conf = tiny_qwen3_config(len(tokenizer), intermediate_size=m.intermediate_size, **common)
        policy = HFPolicy.from_config(conf, seed=cfg.run.seed, dtype=m.dtype, device=m.device)
    if m.trainable_layers:
        freeze_all_but_last(policy.model, m.trainable_layers)
    if policy.vocab_size < len(tokenizer):
        raise CadenzaError(
            f"model vocab ({policy.vocab_size}) is smaller than the tokenizer's ({len(tokenizer)}); they do "
            "not belong together"
        )
    return tokenizer, policy


def freeze_all_but_last(model: torch.nn.Module, n: int) -> list[str]:
    """Leave only the last ``n`` decoder layers and the final norm trainable (embeddings and a tied head
    freeze): a small model's worth of gradients and optimizer state on a CPU. Returns the trainable names."""
    layers = next(
        (mod for name, mod in model.named_modules() if name.endswith("layers") and len(mod) > 0), None
    )
    if not isinstance(layers, torch.nn.ModuleList) or n > len(layers):
        have = len(layers) if isinstance(layers, torch.nn.ModuleList) else 0
        raise CadenzaError(
            f"model.trainable_layers = {n}, but the model has {have} decoder layers; use 1..{have} or 0 (all)"
        )
    keep = {id(p) for layer in list(layers)[-n:] for p in layer.parameters()}
    norm = getattr(getattr(model, "model", model), "norm", None)
    if isinstance(norm, torch.nn.Module):
        keep |= {id(p) for p in norm.parameters()}
    for p in model.parameters():
        p.requires_grad_(id(p) in keep)
    return [name for name, p in model.named_parameters() if p.requires_grad]


# run options that may change between a run and its resumption
_RESUMABLE_CHANGES = {
    "steps",
    "progress",
    "tensorboard",
    "wandb",
    "wandb_project",
    "checkpoint_every",
    "keep_checkpoints",
    "out_dir",
    "threads",
    "measure_kl",
}


def check_same_run(path: Path, cfg: TrainConfig) -> None:
    """Refuse to resume a checkpoint written under a different config (it would silently mix two runs)."""
    if not path.exists():
        return
    old, new = json.loads(path.read_text()), cfg.to_dict()
    default = TrainConfig().to_dict()  # a key the old run did not have yet ran with its default
    diffs = [
        f"{sec}.{k}"
        for sec in new
        for k in new[sec]
        if old.get(sec, {}).get(k, default.get(sec, {}).get(k)) != new[sec][k]
        and not (sec == "run" and k in _RESUMABLE_CHANGES)
        and sec != "parallel"  # another world size or layout: DCP reshards on load
    ]
    if diffs:
        raise CadenzaError(
            f"{path.parent} holds a run with a different config ({', '.join(diffs[:5])}); "
            "use another run.out_dir, or --no-resume to start over"
        )


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """``[optim]`` through the shared builder: AdamW, or Muon (``muon_lr``) with AdamW (``lr``) for the
    rest."""
    from cadenza.optim.build import build_optimizer as build
    from cadenza.optim.config import MuonConfig

    o = cfg.optim
    if o.name == "muon":  # Muon's AdamW groups keep the builder's betas (0.9, 0.95), as they always had
        muon = MuonConfig(adjust_lr="original", adamw_lr=o.lr, ns_dtype=o.muon_ns_dtype)
        return build("muon", model, lr=o.muon_lr, weight_decay=o.weight_decay, muon=muon, decay_vectors=True)
    return build(
        "adamw", model, lr=o.lr, weight_decay=o.weight_decay, betas=tuple(o.betas), decay_vectors=True
    )


def is_off_policy(cfg: TrainConfig) -> bool:
    """Whether the engine's weights can differ from the trainer's (asynchronous rollouts, or another
    engine's kernels): truncated IS (``loss.is_cap``) applies then. The synchronous ``hf`` engine samples
    with the trainer's own module, so its behaviour log-probs already are the trainer's."""
    return cfg.rollout.max_staleness > 0 or cfg.rollout.engine != "hf"
