"""Param groups for HF models: per-head attention, per-expert MoE, whole-matrix MLP, AdamW for the rest.

Supported architectures read their layout from ``model.config``: Qwen3 (``qwen3``), Qwen3-MoE
(``qwen3_moe``) and DeepSeek-V3 with MLA (``deepseek_v3``; Kimi K2.x uses it). Any other model gets the
generic rule: 2-D weights as whole matrices, 3-D stacked weights per expert, AdamW for the rest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from cadenza.optim.granularity import blocks, box_matrix_shape


@dataclass(frozen=True)
class GroupRule:
    """How one parameter is optimised."""

    algorithm: str = "muon"
    granularity: str = "matrix"
    head_dim: int | None = None
    head_axis: int = 0
    split_sizes: tuple[int, ...] | None = None


ADAMW = GroupRule(algorithm="adamw", granularity="-")
MATRIX = GroupRule()


def _moe_rules(cfg: Any) -> list[tuple[str, GroupRule]]:
    inter = cfg.moe_intermediate_size
    return [
        (r"experts\.gate_up_proj$", GroupRule(granularity="expert", split_sizes=(inter, inter))),
        (r"experts\.down_proj$", GroupRule(granularity="expert")),
    ]


def _qwen3_rules(cfg: Any) -> list[tuple[str, GroupRule]]:
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    head = GroupRule(granularity="head", head_dim=hd)
    return [
        (r"self_attn\.(q|k|v)_proj\.weight$", head),
        (r"self_attn\.o_proj\.weight$", GroupRule(granularity="head", head_dim=hd, head_axis=1)),
    ]


def _deepseek_v3_rules(cfg: Any) -> list[tuple[str, GroupRule]]:
    nope, rope, v = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    return [
        (r"self_attn\.(q_proj|q_b_proj)\.weight$", GroupRule(granularity="head", head_dim=nope + rope)),
        (
            r"self_attn\.kv_a_proj_with_mqa\.weight$",
            GroupRule(granularity="head", split_sizes=(cfg.kv_lora_rank, rope)),
        ),
        (r"self_attn\.kv_b_proj\.weight$", GroupRule(granularity="head", head_dim=nope + v)),
        (r"self_attn\.o_proj\.weight$", GroupRule(granularity="head", head_dim=v, head_axis=1)),
    ]


ARCHITECTURES = {
    "qwen3": _qwen3_rules,
    "qwen3_moe": lambda cfg: _qwen3_rules(cfg) + _moe_rules(cfg),
    "deepseek_v3": lambda cfg: _deepseek_v3_rules(cfg) + _moe_rules(cfg),
}


def assign(model: nn.Module, *, granular: bool = True) -> dict[str, GroupRule]:
    """The rule for every parameter name (tied weights appear once)."""
    cfg = getattr(model, "config", None)
    rules = ARCHITECTURES.get(getattr(cfg, "model_type", None), lambda _c: [])(cfg) if granular else []
    embeds = set()
    for getter in ("get_input_embeddings", "get_output_embeddings"):
        mod = getattr(model, getter, lambda: None)()
        if mod is not None:
            embeds.update(id(p) for p in mod.parameters())
    out: dict[str, GroupRule] = {}
    for name, p in model.named_parameters():
        if id(p) in embeds or p.ndim < 2 or p.ndim > 3:
            out[name] = ADAMW
            continue
        rule = next((r for pat, r in rules if re.search(pat, name)), None)
        if rule is None:
            rule = MATRIX if p.ndim == 2 else GroupRule(granularity="expert")
        out[name] = rule
    return out


def muon_param_groups(
    model: nn.Module,
    *,
    granular: bool = True,
    adamw_lr: float | None = None,
    adamw_weight_decay: float | None = None,
    show: bool = False,
) -> list[dict[str, Any]]:
    """Param groups for :class:`cadenza.optim.Muon`: one per distinct rule, named parameters kept.

    ``granular=False`` treats every 2-D weight as one matrix (experts still per expert: a 3-D stack is
    no matrix). ``show=True`` prints the assignment table.
    """
    rules = assign(model, granular=granular)
    params = dict(model.named_parameters())
    groups: dict[GroupRule, dict[str, Any]] = {}
    for name, rule in rules.items():
        g = groups.setdefault(rule, _group_for(rule, adamw_lr, adamw_weight_decay))
        g["params"].append(params[name])
        g["param_names"].append(name)
    if show:
        print_assignment(model, rules)
    return list(groups.values())


def _group_for(rule: GroupRule, adamw_lr: float | None, adamw_wd: float | None) -> dict[str, Any]:
    g: dict[str, Any] = {"params": [], "param_names": [], "algorithm": rule.algorithm}
    if rule.algorithm == "adamw":
        if adamw_lr is not None:
            g["lr"] = adamw_lr
        if adamw_wd is not None:
            g["weight_decay"] = adamw_wd
        return g
    g.update(
        granularity=rule.granularity,
        head_dim=rule.head_dim,
        head_axis=rule.head_axis,
        split_sizes=rule.split_sizes,
    )
    return g


def describe(shape: torch.Size | tuple[int, ...], rule: GroupRule) -> str:
    """``"4 x [16, 64]"``: how many matrices of which shape a parameter becomes."""
    if rule.algorithm == "adamw":
        return "elementwise"
    bxs = blocks(
        shape,
        rule.granularity,
        head_dim=rule.head_dim,
        head_axis=rule.head_axis,
        split_sizes=rule.split_sizes,
    )
    counts: dict[tuple[int, int], int] = {}
    for b in bxs:
        counts[box_matrix_shape(b)] = counts.get(box_matrix_shape(b), 0) + 1
    return " + ".join(f"{n} x [{a}, {b}]" for (a, b), n in counts.items())


def assignment_rows(model: nn.Module, rules: dict[str, GroupRule] | None = None) -> list[tuple[str, ...]]:
    rules = rules or assign(model)
    params = dict(model.named_parameters())
    return [
        (name, str(list(params[name].shape)), r.algorithm, r.granularity, describe(params[name].shape, r))
        for name, r in rules.items()
    ]


def print_assignment(model: nn.Module, rules: dict[str, GroupRule] | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Muon assignment ({getattr(getattr(model, 'config', None), 'model_type', 'model')})")
    table.add_column("parameter", no_wrap=True, overflow="fold")
    for col in ("shape", "algorithm", "granularity", "matrices"):
        table.add_column(col)
    for row in assignment_rows(model, rules):
        table.add_row(*row)
    Console().print(table)
