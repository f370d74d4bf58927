"""``parallelize(model, dims)``: dual-mesh FSDP2 with expert and context parallelism for HF causal LMs.

* FSDP2 ``fully_shard`` per decoder layer and at the root on the **dense** mesh; the routed-experts
  module of each MoE layer gets its own ``fully_shard`` on the **expert** mesh's
  ``(dp_replicate, efsdp)`` part, its parameters already split over ``ep`` (DTensor ``Shard(0)``).
* Gradient scaling: every rank back-propagates only the loss of its own tokens (CP ranks split a
  batch's tokens), so summing over all ranks gives the sum over batches; FSDP divides by the number
  of distinct batches (``dp_replicate·dp_shard``) instead of the mesh size, and gradients equal the
  single-process gradients of the mean loss over batches.
* Context parallelism: :class:`ParallelCausalLM` takes the full batch on every rank of a CP group,
  keeps its head–tail chunks, and returns the loss over all tokens of that batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from cadenza.errors import ConfigError
from cadenza.parallel.context import (
    ContextShare,
    check_seq_len,
    head_tail_positions,
    register_cp_attention,
)
from cadenza.parallel.dims import Meshes, ParallelDims, build_meshes
from cadenza.parallel.expert import apply_expert_parallel, find_routed_experts

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


@dataclass(kw_only=True)
class ParallelOptions:
    """How the model is wrapped. ``param_dtype='bfloat16', reduce_dtype='float32'`` is the usual mix."""

    param_dtype: str = "float32"
    reduce_dtype: str = "float32"
    activation_checkpointing: bool = False
    reshard_after_forward: bool = True

    def dtype(self, name: str) -> torch.dtype:
        value = getattr(self, name)
        if value not in _DTYPES:
            raise ConfigError(f"{name}={value!r} is not a dtype; use one of {sorted(_DTYPES)}")
        return _DTYPES[value]


@dataclass
class ParallelOutput:
    loss: torch.Tensor | None
    logits: torch.Tensor  # this rank's tokens only (head–tail chunks when cp > 1)
    positions: torch.Tensor  # global positions of the local tokens


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder-layer list of an HF causal LM (``model.model.layers`` by convention)."""
    base = getattr(model, "model", model)
    layers = getattr(base, "layers", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        raise ConfigError(
            f"{type(model).__name__} has no decoder layer list at .model.layers; "
            "parallelize supports HF causal LMs (Qwen3, Qwen3-MoE, DeepSeek-V3, ...)"
        )
    return layers


def check_model(model: nn.Module, dims: ParallelDims) -> None:
    """Everything about the model that can be wrong for ``dims``, checked before any collective."""
    layers = decoder_layers(model)
    experts = find_routed_experts(model)
    if dims.ep > 1:
        if not experts:
            raise ConfigError(
                f"ep={dims.ep} but {type(model).__name__} has no routed-experts module "
                "(stacked gate_up_proj/down_proj); use ep=1 for dense models"
            )
        for name, m in experts:
            n = m.num_experts if hasattr(m, "num_experts") else m.gate_up_proj.shape[0]
            if n % dims.ep:
                raise ConfigError(
                    f"ep={dims.ep} does not divide the number of experts ({n}) of {name}; "
                    "choose ep among the divisors of num_experts"
                )
    if dims.cp > 1 and not all(hasattr(layer, "self_attn") for layer in layers):
        raise ConfigError(
            f"cp={dims.cp} needs decoder layers with a .self_attn module; {type(layers[0]).__name__} has none"
        )


class ParallelCausalLM(nn.Module):
    """The parallelized model: ``model(input_ids=..., labels=...)`` with the same batch on every CP rank."""

    def __init__(self, model: nn.Module, meshes: Meshes) -> None:
        super().__init__()
        self.model = model
        self.meshes = meshes
        self.dims = meshes.dims
        self.cp_rank = meshes.cp.get_local_rank()
        self.cp_group = meshes.cp.get_group() if self.dims.cp > 1 else None

    @property
    def context(self) -> ContextShare | None:
        """This rank's share of a sequence under context parallelism (``None`` when ``cp == 1``)."""
        if self.cp_group is None:
            return None
        return ContextShare(group=self.cp_group, size=self.dims.cp, rank=self.cp_rank)

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> ParallelOutput:
        batch, seq_len = input_ids.shape
        cp = self.dims.cp
        if cp > 1:
            check_seq_len(seq_len, cp)
            if attention_mask is not None and not bool(attention_mask.all()):
                raise ConfigError(
                    "attention_mask with padding is not supported with cp > 1; right-pad and "
                    "set the padded labels to -100 instead (causal attention ignores them)"
                )
            attention_mask = None
            positions = head_tail_positions(seq_len, cp, self.cp_rank).to(input_ids.device)
        else:
            positions = torch.arange(seq_len, device=input_ids.device)
        out = self.model(
            input_ids=input_ids[:, positions],
            attention_mask=attention_mask,
            position_ids=positions[None].expand(batch, -1),
            use_cache=False,
        )
        loss = None if labels is None else self._loss(out.logits, labels, positions)
        return ParallelOutput(loss=loss, logits=out.logits, positions=positions)

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Mean next-token loss over the whole batch; backward flows through the local tokens only."""
        shifted = torch.cat([labels[:, 1:], labels.new_full((labels.shape[0], 1), -100)], dim=1)
        n_valid = (shifted != -100).sum().clamp(min=1)
        local_labels = shifted[:, positions]
        local = (
            nn.functional.cross_entropy(
                logits.float().flatten(0, 1), local_labels.flatten(), ignore_index=-100, reduction="sum"
            )
            / n_valid
        )
        if self.cp_group is None:
            return local
        total = local.detach().clone()
        dist.all_reduce(total, group=self.cp_group)
        return local + (total - local.detach())


def parallelize(
    model: nn.Module,
    dims: ParallelDims | Meshes,
    options: ParallelOptions | None = None,
    device_type: str = "cpu",
) -> ParallelCausalLM:
    """Shard ``model`` (an HF causal LM, same weights on every rank) over the dual mesh; see module doc."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    options = options or ParallelOptions()
    mp = MixedPrecisionPolicy(
        param_dtype=options.dtype("param_dtype"), reduce_dtype=options.dtype("reduce_dtype")
    )
    if isinstance(dims, Meshes):
        meshes = dims
    else:
        if not dist.is_initialized():
            raise ConfigError("torch.distributed is not initialised; launch with torchrun")
        check_model(model, dims.resolve(dist.get_world_size()))
        meshes = build_meshes(dims, device_type)
    d = meshes.dims
    check_model(model, d)

    if options.activation_checkpointing:
        ac_kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=ac_kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=ac_kwargs)
    if d.ep > 1:
        apply_expert_parallel(model, meshes.ep)
    layers = decoder_layers(model)
    if d.cp > 1:
        model.config._attn_implementation = register_cp_attention()
        cp_mesh = meshes.cp
        for layer in layers:
            layer.self_attn._cadenza_cp = (cp_mesh.get_group(), d.cp, cp_mesh.get_local_rank())

    kwargs = dict(mp_policy=mp, reshard_after_forward=options.reshard_after_forward)
    sharded = []
    for layer in layers:
        for _, experts in find_routed_experts(layer):
            sharded.append((fully_shard(experts, mesh=meshes.expert_fsdp, **kwargs), d.efsdp))
        sharded.append((fully_shard(layer, mesh=meshes.dense, **kwargs), d.dp_shard_cp))
    root = fully_shard(model, mesh=meshes.dense, mp_policy=mp, reshard_after_forward=False)
    sharded.append((root, d.dp_shard_cp))
    force_sum = dist.get_backend() == "gloo"  # gloo has no PREMUL_SUM: scale around a plain SUM
    for module, shard_size in sharded:
        module.set_gradient_divide_factor(
            _divide_factor(d.dp, shard_size, force_sum or mp.reduce_dtype == torch.float16)
        )
        if force_sum:
            module.set_force_sum_reduction_for_comms(True)
    return ParallelCausalLM(model, meshes)


def _divide_factor(n_batches: int, shard_size: int, sum_reduction: bool) -> float:
    """The factor to hand FSDP2 so that gradients end up divided by ``n_batches``.

    torch 2.13's FSDP2 divides twice when the shard group has one rank and the reduction is a
    plain SUM (gloo, or fp16 reduce): once in the single-rank copy path and once after the
    all-reduce. There the square root gives the intended total division.
    """
    return math.sqrt(n_batches) if shard_size == 1 and sum_reduction else float(n_batches)
