"""Parallel dimensions and the two device meshes they define over the same ranks.

Ranks are laid out row-major as ``(dp_replicate, dp_shard, cp)``: the CP group of a rank is its
``cp`` neighbours, the ranks that see different batches are the ``dp_replicate × dp_shard`` rows.
Over those same ranks two meshes are built:

* dense  ``(dp_replicate, dp_shard_cp)`` with ``dp_shard_cp = dp_shard · cp`` — FSDP2 of the
  attention, norms, embeddings and shared experts (HSDP across ``dp_replicate``);
* expert ``(dp_replicate, efsdp, ep)`` with ``efsdp = dp_shard · cp / ep`` — the routed experts are
  split ``ep`` ways (each rank owns ``E/ep`` experts) and FSDP-sharded ``efsdp`` ways.

Because ``ep`` may use the CP ranks as well as the data-parallel ones, CP=2 and EP=8 fit in
8 ranks instead of 16 on one shared mesh.
"""

from __future__ import annotations

from dataclasses import dataclass

from cadenza.errors import ConfigError


@dataclass(kw_only=True)
class ParallelDims:
    """How the world is split. ``dp_shard=-1`` takes whatever the other dims leave."""

    dp_replicate: int = 1  # HSDP replicas (gradients all-reduced across them)
    dp_shard: int = -1  # FSDP shards per replica; -1 = the world size divided by dp_replicate·cp
    cp: int = 1  # context-parallel ranks (sequence split with head/tail load balancing)
    ep: int = 1  # expert-parallel ranks: each owns E/ep routed experts; divides dp_shard·cp

    def resolve(self, world_size: int) -> ParallelDims:
        """Return fully specified dims for ``world_size``; a ConfigError names what does not fit."""
        for name in ("dp_replicate", "cp", "ep"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"parallel.{name} must be an integer >= 1, got {value!r}")
        if not isinstance(self.dp_shard, int) or (self.dp_shard < 1 and self.dp_shard != -1):
            raise ConfigError(
                f"parallel.dp_shard must be an integer >= 1 or -1 (fill), got {self.dp_shard!r}"
            )
        fixed = self.dp_replicate * self.cp
        dp_shard = self.dp_shard
        if dp_shard == -1:
            if world_size % fixed:
                raise ConfigError(
                    f"world size {world_size} is not divisible by dp_replicate·cp = "
                    f"{self.dp_replicate}·{self.cp}"
                    f" = {fixed}; change the dims or the number of processes"
                )
            dp_shard = world_size // fixed
        if self.dp_replicate * dp_shard * self.cp != world_size:
            raise ConfigError(
                f"dims dp_replicate={self.dp_replicate} × dp_shard={dp_shard} × cp={self.cp} = "
                f"{self.dp_replicate * dp_shard * self.cp} but the world size is {world_size}; "
                "set dp_shard=-1 to fill or launch that many processes"
            )
        if (dp_shard * self.cp) % self.ep:
            raise ConfigError(
                f"ep={self.ep} must divide dp_shard·cp = {dp_shard}·{self.cp} = {dp_shard * self.cp} "
                "(experts are split over the data-parallel and context-parallel ranks of one replica)"
            )
        return ParallelDims(dp_replicate=self.dp_replicate, dp_shard=dp_shard, cp=self.cp, ep=self.ep)

    @property
    def world_size(self) -> int:
        self._check_resolved()
        return self.dp_replicate * self.dp_shard * self.cp

    @property
    def dp_shard_cp(self) -> int:
        self._check_resolved()
        return self.dp_shard * self.cp

    @property
    def efsdp(self) -> int:
        return self.dp_shard_cp // self.ep

    @property
    def dp(self) -> int:
        """Number of distinct batches per step (data-parallel degree without CP)."""
        self._check_resolved()
        return self.dp_replicate * self.dp_shard

    def dp_rank(self, rank: int) -> int:
        """Which batch ``rank`` takes: every rank of one CP group shares it."""
        return rank // self.cp

    def cp_rank(self, rank: int) -> int:
        return rank % self.cp

    def _check_resolved(self) -> None:
        if self.dp_shard < 1:
            raise AssertionError("call ParallelDims.resolve(world_size) first")


@dataclass(kw_only=True)
class Meshes:
    """The meshes of one run. ``dense`` and ``expert`` span the same ranks with different shapes."""

    dims: ParallelDims
    world: object  # DeviceMesh (dp_replicate, dp_shard, cp)
    dense: object  # DeviceMesh (dp_replicate, dp_shard_cp)
    expert: object  # DeviceMesh (dp_replicate, efsdp, ep)

    @property
    def cp(self):
        return self.world["cp"]

    @property
    def ep(self):
        return self.expert["ep"]

    @property
    def expert_fsdp(self):
        """The 2-D (dp_replicate, efsdp) mesh FSDP2 shards the experts over."""
        return self.expert["dp_replicate", "efsdp"]


def build_meshes(dims: ParallelDims, device_type: str = "cpu") -> Meshes:
    """Build the world, dense and expert meshes (call on every rank after init_process_group)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        raise ConfigError(
            "torch.distributed is not initialised; launch with torchrun (or cadenza.testing.spawn)"
        )
    d = dims.resolve(dist.get_world_size())
    world = init_device_mesh(
        device_type, (d.dp_replicate, d.dp_shard, d.cp), mesh_dim_names=("dp_replicate", "dp_shard", "cp")
    )
    dense = init_device_mesh(
        device_type, (d.dp_replicate, d.dp_shard_cp), mesh_dim_names=("dp_replicate", "dp_shard_cp")
    )
    expert = init_device_mesh(
        device_type, (d.dp_replicate, d.efsdp, d.ep), mesh_dim_names=("dp_replicate", "efsdp", "ep")
    )
    return Meshes(dims=d, world=world, dense=dense, expert=expert)
