"""Expert parallelism for HF transformers routed-experts modules (Qwen3-MoE, DeepSeek-V3 / Kimi K2).

transformers 5 stores a layer's routed experts as two stacked parameters, ``gate_up_proj [E, 2I, H]``
and ``down_proj [E, H, I]``, in a module called as ``experts(hidden, top_k_index, top_k_weights)``.
:class:`ExpertParallelExperts` replaces that module: each EP rank owns ``E/ep`` consecutive experts
(a ``Shard(0)`` DTensor on the EP mesh), tokens travel to the rank owning their expert with
``all_to_all_single`` (the per-expert counts are exchanged first so every rank knows its splits),
are computed there and travel back. The router, top-k, shared experts and DeepSeek-V3's
score-correction bias live outside this module and are left untouched.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from cadenza.errors import ConfigError
from cadenza.parallel.comm import all_to_all


def is_routed_experts(module: nn.Module) -> bool:
    """True for a stacked-3D SwiGLU experts module as transformers 5 writes them."""
    params = dict(module.named_parameters(recurse=False))
    return (
        set(params) == {"gate_up_proj", "down_proj"}
        and params["gate_up_proj"].ndim == 3
        and params["down_proj"].ndim == 3
        and hasattr(module, "act_fn")
    )


def find_routed_experts(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Qualified names and modules of every routed-experts module in ``model``."""
    return [
        (name, m)
        for name, m in model.named_modules()
        if is_routed_experts(m) or isinstance(m, ExpertParallelExperts)
    ]


def _local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t


class ExpertParallelExperts(nn.Module):
    """Drop-in replacement of an HF experts module whose experts are spread over an EP group."""

    def __init__(self, experts: nn.Module, ep_mesh) -> None:
        super().__init__()
        from torch.distributed.tensor import DTensor, Shard

        gate_up, down = experts.gate_up_proj, experts.down_proj
        self.num_experts = gate_up.shape[0]
        self.ep_size = ep_mesh.size()
        if self.num_experts % self.ep_size:
            raise ConfigError(
                f"ep={self.ep_size} does not divide the number of experts ({self.num_experts}); "
                "choose ep among the divisors of num_experts"
            )
        self.num_local = self.num_experts // self.ep_size
        self.ep_group = ep_mesh.get_group()
        start = ep_mesh.get_local_rank() * self.num_local
        self.act_fn = experts.act_fn

        def shard(p: torch.Tensor) -> nn.Parameter:
            local = p.detach()[start : start + self.num_local].clone()
            return nn.Parameter(
                DTensor.from_local(
                    local, ep_mesh, [Shard(0)], run_check=False, shape=p.shape, stride=p.stride()
                )
            )

        self.gate_up_proj = shard(gate_up)
        self.down_proj = shard(down)

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        k = top_k_index.shape[1]
        group, ep, n_loc = self.ep_group, self.ep_size, self.num_local
        flat_expert = top_k_index.reshape(-1)
        order = torch.argsort(flat_expert, stable=True)  # assignments grouped by expert, hence by rank
        token_of = order // k
        counts = torch.bincount(flat_expert, minlength=self.num_experts)
        # Counts first: rank r learns how many rows of each of its experts every rank will send.
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts, group=group)
        recv_counts = recv_counts.view(ep, n_loc)
        send_splits = counts.view(ep, n_loc).sum(1).tolist()
        recv_splits = recv_counts.sum(1).tolist()

        received = all_to_all(hidden_states[token_of], recv_splits, send_splits, group)
        local_id = torch.arange(n_loc, device=received.device).repeat(ep)
        row_expert = torch.repeat_interleave(local_id, recv_counts.reshape(-1))
        gate_up, down = _local(self.gate_up_proj), _local(self.down_proj)
        out = torch.zeros_like(received)
        for e in range(n_loc):
            # No skipping of experts without tokens: the (empty) matmul still gives their weights a
            # zero gradient, so every rank joins FSDP's gradient reduce-scatter for this module.
            rows = (row_expert == e).nonzero().squeeze(1)
            gate, up = nn.functional.linear(received[rows], gate_up[e]).chunk(2, dim=-1)
            out = out.index_add(0, rows, nn.functional.linear(self.act_fn(gate) * up, down[e]))

        returned = all_to_all(out, send_splits, recv_splits, group)
        weights = top_k_weights.reshape(-1)[order]
        contrib = (returned * weights[:, None]).to(hidden_states.dtype)
        return torch.zeros_like(hidden_states).index_add(0, token_of, contrib)


def apply_expert_parallel(model: nn.Module, ep_mesh) -> int:
    """Replace every routed-experts module of ``model`` by its EP version; returns how many."""
    found = [(name, m) for name, m in model.named_modules() if is_routed_experts(m)]
    if not found:
        raise ConfigError(
            f"ep={ep_mesh.size()} but {type(model).__name__} has no routed-experts module "
            "(stacked gate_up_proj/down_proj); use ep=1 for dense models"
        )
    for name, module in found:
        n = module.gate_up_proj.shape[0]
        if n % ep_mesh.size():
            raise ConfigError(
                f"ep={ep_mesh.size()} does not divide the number of experts ({n}) of {name}; "
                "choose ep among the divisors of num_experts"
            )
    for name, module in found:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, ExpertParallelExperts(module, ep_mesh))
    return len(found)
