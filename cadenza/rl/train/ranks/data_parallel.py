"""Data-parallel RL training under torchrun: rank 0 collects, every rank learns its share.

Every rank holds the whole policy (replicated, as with DDP). Rank 0 alone talks to the outside world:
it draws the step's tasks, owns the rollout engine, the rollout workers or the Ray driver, records
the task pool, writes metrics and checkpoints, and syncs the engines. It broadcasts each step's
episodes; every rank then builds the same microbatches, advantages and token-count normalisers, runs
the forward and backward of its own share (microbatch ``i`` on rank ``i % world``), and the gradients
are summed across ranks. The loss is a sum over microbatches weighted by global token counts, so the
summed gradient is the single-process one up to float summation order; every rank clips and steps
the same gradient, so the replicas stay equal (checked at start and by the tests).

Broadcasting whole episodes (token ids, a few KB each) costs far less than a step's forward passes.
Sharding the weights themselves on the dual mesh (FSDP2, EP) is :mod:`cadenza.rl.train.ranks.sharding`, whose
group refines this one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist

from cadenza.errors import CadenzaError
from cadenza.parallel.launch import init_distributed, launched_ranks, share_from_rank0

T = TypeVar("T")


@dataclass(frozen=True)
class DataParallel:
    """This process's place in the trainer's data-parallel group (world 1: a plain single process)."""

    rank: int = 0
    world: int = 1
    device: str = "cpu"  # where collectives' small tensors live: the GPU under NCCL
    owns_group: bool = False  # joined here (not by a caller, e.g. a test harness): :meth:`leave` ends it
    # CADENZA_FORCE_SHARDING=1: shard the policy even in one process (a one-rank group; the one-GPU
    # check of the sharded path in bench/gpu_sharded_rl.sh and its CPU analogue)
    force_sharding: bool = False

    @classmethod
    def join(cls, *, timeout_s: float | None = None) -> DataParallel:
        """The group torchrun launched (joined here if needed, its collectives bounded by ``timeout_s``),
        or a single process when not launched."""
        owns = False
        force = os.environ.get("CADENZA_FORCE_SHARDING") == "1"
        if not dist.is_initialized():
            if launched_ranks() <= 1 and not force:
                return cls()
            owns, _ = init_distributed(single_process_group=force, timeout_s=timeout_s)
        device = f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"
        return cls(rank=dist.get_rank(), world=dist.get_world_size(), device=device, owns_group=owns,
                   force_sharding=force)  # fmt: skip

    def leave(self) -> None:
        """End the group if :meth:`join` created it (every rank, after its last collective)."""
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()

    @property
    def main(self) -> bool:
        """Rank 0: the rank that collects rollouts, syncs engines, logs and checkpoints."""
        return self.rank == 0

    def mine(self, n: int) -> list[int]:
        """The indices of ``n`` microbatches this rank computes."""
        return list(range(self.rank, n, self.world))

    def schedule(self, n: int) -> list[tuple[int, bool]]:
        """``(microbatch, ghost)`` pairs this rank runs; replicas never need a ghost (see
        :class:`cadenza.rl.train.ranks.sharding.ShardedGroup`)."""
        return [(k, False) for k in self.mine(n)]

    @property
    def per_round(self) -> int:
        """Distinct microbatches computed at once, one per rank (a round of :meth:`schedule`)."""
        return self.world

    @property
    def lockstep(self) -> bool:
        """Whether every rank must run the same forwards (sharded weights); replicas need not."""
        return False

    @property
    def loss_scale(self) -> float:
        """What each rank multiplies its loss by before backward (replicas sum their gradients)."""
        return 1.0

    def share(self, fn: Callable[[], T]) -> T:
        """``fn()`` run on rank 0, its result (or its error) on every rank."""
        return fn() if self.world == 1 else share_from_rank0(fn)

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def sum_grads(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Sum every gradient across ranks, in one flat buffer per dtype and device.

        A parameter without a gradient on this rank (its microbatches did not reach it, or this rank
        had none) joins with zeros when another rank has one; one without a gradient anywhere keeps
        ``None``, as in a single process (an optimizer treats a zero gradient and none differently).
        """
        if self.world == 1:
            return
        params = [p for p in params if p.requires_grad]
        if not params:
            return
        has = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=self.device)
        dist.all_reduce(has, op=dist.ReduceOp.MAX)
        buckets: dict[tuple[torch.dtype, torch.device], list[torch.nn.Parameter]] = {}
        for p, flag in zip(params, has.tolist(), strict=True):
            if flag:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                buckets.setdefault((p.grad.dtype, p.grad.device), []).append(p)
        for group in buckets.values():
            flat = torch.cat([p.grad.reshape(-1) for p in group])
            dist.all_reduce(flat)
            offset = 0
            for p in group:
                n = p.grad.numel()
                p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
                offset += n

    def sum_floats(self, values: Sequence[float]) -> list[float]:
        """Per-rank partial sums of metrics, summed across ranks (float64)."""
        if self.world == 1:
            return list(values)
        t = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.tolist()

    def check_replicas(self, module: torch.nn.Module) -> None:
        """Fail before training when the ranks do not start from the same weights (a different model
        file on one node, a different seed): their updates would silently diverge."""
        if self.world == 1:
            return
        with torch.no_grad():
            sums = torch.stack([p.detach().double().sum() for p in module.parameters()]).to(self.device)
        gathered = [torch.empty_like(sums) for _ in range(self.world)]
        dist.all_gather(gathered, sums)
        bad = [r for r, g in enumerate(gathered) if not torch.equal(g, gathered[0])]
        if bad:
            raise CadenzaError(
                f"rank(s) {bad} hold other initial weights than rank 0; every rank must load the same "
                "model.path (on a shared filesystem) with the same run.seed"
            )
