"""The RL policy on the dual mesh: the same ``[parallel]`` table and :mod:`cadenza.parallel` as pretraining.

Under torchrun (world > 1, or one rank with ``CADENZA_FORCE_SHARDING=1``) every rank builds the same HF
model, the trainer's copies of it (a frozen, EMA or snapshot teacher, the KL reference) and, on rank 0
for the ``hf`` engine or the probe only, one unsharded *rollout copy*; then the
policy, the teacher and the reference are wrapped by :func:`cadenza.parallel.parallelize` in place
(FSDP2 on the dense mesh, routed experts split over ``ep`` on the expert mesh) and the optimizer
(granular sharded Muon or AdamW) is built over the shards, as ``cadenza pretrain`` does.

* **Lockstep.** FSDP2 all-gathers and EP all-to-alls are collectives, so every rank runs the same
  sequence of forwards: microbatch ``k`` of a step goes to data-parallel batch ``k % dp`` in rounds
  (every rank of a CP group takes the same one), and a rank with nothing left in a round runs a
  *ghost* (the round's first microbatch with loss weight 0); a rank whose microbatch has no hinted
  turn while another's has runs the teacher once on that one.
* **Context parallelism** (``cp > 1``). Each rank of a CP group right-pads the microbatch to a multiple
  of ``2·cp`` and runs the decoder on its head–tail share (pretraining's chunks and K/V all-gather
  attention, :mod:`cadenza.parallel.context`). It computes the log-probs and SD divergences of the
  tokens its positions predict; the per-token values are summed over the CP group with a backward that
  keeps each rank's gradient on its share, so every rank computes the whole microbatch's losses and
  metrics while back-propagating its share only, and FSDP2's sum is the unsplit gradient. The
  teacher's hidden states are gathered (no gradient) to meet the student's positions; the reference
  scores its share like the policy. Metrics are summed over one rank per CP group.
* **Entering through the root.** The losses need the decoder's hidden states and apply the LM head
  in chunks; FSDP2 requires the root module's forward to run first, so :func:`decoder_through_root`
  runs the root with ``logits_to_keep`` empty and captures the decoder's output. The root stays
  unsharded until backward, so the chunked LM head and the SD divergence (full vocabulary or top-k)
  use its weights without gathering the rest of the model.
* **Gradients.** parallelize divides by the number of data-parallel batches (pretraining's mean);
  the RL loss is a sum over microbatches already weighted by global token counts, so each rank scales
  its loss by ``dims.dp`` and the reduced gradient is the single-process one.
* **Rollouts.** A ``vllm`` engine is synced straight from the shards (:mod:`.stream_sync`: every rank
  gathers one full tensor at a time, rank 0 feeds the engine's buckets): no rank holds the whole model.
  The ``hf`` engine (and the hint-following probe) need an unsharded *rollout copy* on rank 0, refreshed
  from the shards after every update the same way; it exists only then (``stream_sync.needs_rollout_copy``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from cadenza.errors import ConfigError
from cadenza.parallel import ParallelDims, ParallelOptions, parallelize
from cadenza.parallel.context import ContextShare
from cadenza.parallel.dims import build_meshes
from cadenza.parallel.parallelize import check_model
from cadenza.rl.engines.policy import HFPolicy
from cadenza.rl.engines.weights import named_full_tensors
from cadenza.rl.train.local_engine import save_initial
from cadenza.rl.train.ranks.data_parallel import DataParallel
from cadenza.rl.train.ranks.stream_sync import needs_rollout_copy

if TYPE_CHECKING:
    from cadenza.rl.config import TrainConfig

_NO_LOGITS = torch.zeros(0, dtype=torch.long)


def check_parallel(cfg: TrainConfig, world: int, model: torch.nn.Module) -> ParallelDims:
    """``[parallel]`` against the world size and the model, before any collective (one-line errors)."""
    dims = cfg.parallel.resolve(world)
    check_model(model, dims)
    if dims.cp > 1:
        check_context(cfg.rollout.max_context_tokens, dims.cp, model)
    if cfg.model.trainable_layers:
        raise ConfigError("model.trainable_layers needs one process; set it to 0 for a sharded run")
    return dims


def check_context(max_tokens: int, cp: int, model: torch.nn.Module) -> None:
    """Whether trajectories of up to ``max_tokens`` split into ``2·cp`` chunks inside the model's window."""
    if max_tokens < 2 * cp:
        raise ConfigError(
            f"parallel.cp = {cp} splits every sequence into 2·cp = {2 * cp} chunks but "
            f"rollout.max_context_tokens = {max_tokens} is shorter; lower parallel.cp or raise "
            "rollout.max_context_tokens"
        )
    window = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    padded = -(-max_tokens // (2 * cp)) * 2 * cp
    if isinstance(window, int) and max_tokens <= window < padded:
        raise ConfigError(
            f"parallel.cp = {cp} pads sequences to a multiple of {2 * cp}: rollout.max_context_tokens = "
            f"{max_tokens} becomes {padded}, past the model's max_position_embeddings = {window}; set "
            f"rollout.max_context_tokens <= {window // (2 * cp) * 2 * cp}"
        )


def decoder_through_root(model: torch.nn.Module, **kwargs: Any) -> Any:
    """The decoder's output (hidden states, cache) computed by running the FSDP2 root's forward."""
    captured: list[Any] = []
    hook = model.get_decoder().register_forward_hook(lambda _m, _a, out: captured.append(out))
    try:
        ids = kwargs["input_ids"]
        model(**kwargs, logits_to_keep=_NO_LOGITS.to(ids.device))
    finally:
        hook.remove()
    return captured[-1]


def decoder_share(
    model: torch.nn.Module,
    context: ContextShare,
    *,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    gather: bool = False,
    **_: Any,
) -> Any:
    """The decoder over this rank's share of right-padded sequences (context parallelism, no KV cache).

    The padding of the batch and of the CP split comes after every real token, so causal attention
    keeps it out of the real tokens' states and the attention mask can go. ``gather``: the whole
    ``[B, T, D]`` hidden states (no gradient: the teacher's), else this rank's share.
    """
    B, T = input_ids.shape
    if attention_mask is not None and bool((attention_mask.cummin(-1).values != attention_mask).any()):
        raise ConfigError("context parallelism needs right-padded sequences (an attention mask 1…1 0…0)")
    if position_ids is None:
        position_ids = torch.arange(T, device=input_ids.device)[None].expand(B, -1)
    pad = context.padded_len(T) - T
    if pad:
        tail = position_ids[:, -1:] + torch.arange(1, pad + 1, device=input_ids.device)[None]
        position_ids = torch.cat([position_ids, tail], dim=1)
    local = context.positions(T, input_ids.device)
    out = decoder_through_root(
        model, input_ids=context.split(input_ids), position_ids=position_ids[:, local], use_cache=False
    )
    if gather:
        out.last_hidden_state = context.gather(out.last_hidden_state, T)
    return out


class ThroughRoot:
    """An FSDP2-wrapped HF causal LM whose ``get_decoder()`` enters through the root (for the teacher
    and the KL reference, which call the decoder themselves); everything else is the model's.
    Under context parallelism the decoder runs on this rank's share of the sequence and returns the
    whole sequence's hidden states (``gather``: the teacher's) or the share (the reference's)."""

    def __init__(
        self, model: torch.nn.Module, context: ContextShare | None = None, gather: bool = True
    ) -> None:
        self.module = model
        self.context, self.gather = context, gather

    def get_decoder(self) -> Callable[..., Any]:
        if self.context is not None:
            return lambda **kw: decoder_share(self.module, self.context, gather=self.gather, **kw)
        return lambda **kw: decoder_through_root(self.module, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.module, name)


class ShardedHFPolicy(HFPolicy):
    """:class:`HFPolicy` over the sharded model: hidden states through the root (of this rank's share of
    the sequence under context parallelism, :attr:`context`), no sampling here."""

    def __init__(self, model: torch.nn.Module, *, device: Any, context: ContextShare | None = None) -> None:
        super().__init__(model, device=device)
        self.context = context

    def decoder(self) -> Callable[..., Any]:
        return ThroughRoot(self.model, self.context, gather=False).get_decoder()

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kw: Any):
        """As :meth:`HFPolicy.hidden_states`; under context parallelism this rank's share and no cache
        (a live teacher recomputes the shared prefix instead of reading it from the student's cache)."""
        if self.context is None:
            return super().hidden_states(input_ids, attention_mask, **kw)
        out = self.decoder()(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=kw.get("position_ids")
        )
        return out.last_hidden_state, None

    def sample(self, request: Any) -> Any:
        raise ConfigError("a sharded policy samples through the rollout copy on rank 0")


@dataclass(frozen=True)
class ShardedGroup(DataParallel):
    """The trainer's group when the policy is sharded: lockstep rounds, gradients reduced by FSDP2."""

    dims: ParallelDims = field(default_factory=ParallelDims)

    @property
    def lockstep(self) -> bool:
        return True

    @property
    def loss_scale(self) -> float:
        return float(self.dims.dp)

    @property
    def per_round(self) -> int:
        """One microbatch per data-parallel batch: the ranks of a CP group share theirs."""
        return self.dims.dp

    def schedule(self, n: int) -> list[tuple[int, bool]]:
        """``(microbatch, ghost)`` for each round; a ghost repeats the round's first microbatch."""
        rounds, dp_rank = -(-n // self.per_round), self.dims.dp_rank(self.rank)
        return [
            (k, False) if (k := r * self.per_round + dp_rank) < n else (r * self.per_round, True)
            for r in range(rounds)
        ]

    def sum_floats(self, values: Sequence[float]) -> list[float]:
        """As :meth:`DataParallel.sum_floats`, counting each CP group once: its ranks computed the same
        microbatches, and their metrics are of the whole sequences."""
        keep = self.dims.cp_rank(self.rank) == 0
        return super().sum_floats([v if keep else 0.0 for v in values])

    def sum_grads(self, params: Any) -> None:
        """FSDP2 already reduce-scattered every gradient in backward."""

    def check_replicas(self, module: torch.nn.Module) -> None:
        """Every rank loaded the same model before sharding (checked by the caller's fingerprint)."""


@dataclass
class ShardedPolicy:
    """What :func:`shard` made: the dims, the rollout copy (rank 0) and the wrapped modules."""

    dims: ParallelDims
    group: ShardedGroup
    rollout: HFPolicy | None
    modules: dict[str, torch.nn.Module]
    probe_teacher: torch.nn.Module | None = None
    """Rank 0's unsharded teacher for the hint-following probe (``probe.every > 0``, teacher not live)."""
    probe_every: int = 0
    teacher_kind: str = "frozen"
    context: ContextShare | None = None
    """This rank's share of every sequence (``parallel.cp > 1``)."""

    def load_checkpoint(
        self, path: Path, model: torch.nn.Module, optimizer: Any, *, modules: dict[str, torch.nn.Module]
    ) -> tuple[int, dict[str, Any]]:
        """:func:`load_checkpoint`, then the rollout copy (and probe teacher) take the loaded weights."""
        out = load_checkpoint(path, model, optimizer, modules=modules)
        self.refresh_rollout_copy(model)
        if self.probe_every > 0 and "teacher" in self.modules:
            _gather_into(self.probe_teacher, self.modules["teacher"])
        return out

    keep_copy: bool = True
    """Whether rank 0 holds a rollout copy (the same on every rank: refreshing it is collective)."""

    def refresh_rollout_copy(self, model: torch.nn.Module) -> None:
        """Every rank: gather the shards tensor by tensor; rank 0 copies them into its rollout copy."""
        if self.keep_copy:
            _gather_into(self.rollout.model if self.rollout is not None else None, model)

    def probe_models(self, done_steps: int, teacher: Any) -> tuple[torch.nn.Module, torch.nn.Module]:
        """Every rank (collective when the probe is due and the teacher moves): the unsharded student and
        teacher rank 0's probe measures (a live teacher is the student)."""
        due = self.probe_every > 0 and done_steps % self.probe_every == 0
        if due and self.probe_teacher is not None and self.teacher_kind != "frozen":
            _gather_into(self.probe_teacher if self.rollout is not None else None, teacher.module)
        student = self.rollout.model if self.rollout is not None else teacher
        return student, self.probe_teacher if self.probe_teacher is not None else student


def _gather_into(target: torch.nn.Module | None, sharded: torch.nn.Module) -> None:
    """Every rank iterates (each full tensor is a collective); ``target`` (rank 0) takes the values."""
    params = dict(target.named_parameters()) if target is not None else {}
    with torch.no_grad():
        for name, full in named_full_tensors(sharded):
            if name in params:
                params[name].copy_(full)


def shard(
    cfg: TrainConfig, dp: DataParallel, policy: HFPolicy, copies: dict[str, torch.nn.Module]
) -> ShardedPolicy:
    """Wrap ``policy.model`` and the unsharded ``copies`` (teacher, reference) in place on the dual mesh."""
    dims = check_parallel(cfg, dp.world, policy.model)
    rollout = probe_teacher = None
    keep_copy = needs_rollout_copy(cfg)
    if dp.main and keep_copy:
        rollout = HFPolicy(copy.deepcopy(policy.model), device=policy.device)
        rollout.model.requires_grad_(False)
        if cfg.probe.every > 0 and "teacher" in copies:
            probe_teacher = copy.deepcopy(copies["teacher"])
    options = ParallelOptions(param_dtype=cfg.model.dtype, reduce_dtype="float32")
    meshes = build_meshes(dims, policy.device.type)  # one set of meshes (process groups) for all three
    wrapped = parallelize(policy.model, meshes, options)
    for module in copies.values():
        parallelize(module, meshes, options)
    group = ShardedGroup(rank=dp.rank, world=dp.world, device=dp.device, owns_group=dp.owns_group, dims=dims,
                         force_sharding=dp.force_sharding)  # fmt: skip
    return ShardedPolicy(
        dims=dims, group=group, rollout=rollout, modules=dict(copies), probe_teacher=probe_teacher,
        probe_every=cfg.probe.every, teacher_kind=cfg.teacher.weights, context=wrapped.context,
        keep_copy=keep_copy,
    )  # fmt: skip


def shard_trainer(trainer: Any) -> ShardedPolicy:
    """Wrap a :class:`~cadenza.rl.train.trainer.Trainer`'s policy, teacher and reference in place."""
    copies = {} if trainer.teacher.config.weights == "live" else {"teacher": trainer.teacher.model}
    cfg = trainer.cfg
    if trainer.dp.main and cfg.rollout.engine == "vllm" and not cfg.model.path:
        # a served engine starts from a directory: write the random initial weights while they are whole
        save_initial(trainer.policy, trainer.tokenizer, Path(cfg.run.out_dir) / "engine-model")
    if trainer.ref_model is not None:
        copies["reference"] = trainer.ref_model
    shards = shard(trainer.cfg, trainer.dp, trainer.policy, copies)
    trainer.dp = shards.group
    trainer.rollout_policy = shards.rollout
    trainer.policy = ShardedHFPolicy(trainer.model, device=trainer.policy.device, context=shards.context)
    trainer.teacher.model = ThroughRoot(trainer.teacher.model, shards.context, gather=True)
    if trainer.ref_model is not None:  # its log-probs are computed per share, like the policy's
        trainer.ref_model = ThroughRoot(trainer.ref_model, shards.context, gather=False)
    return shards


def save_checkpoint(trainer: Any, state: dict[str, Any]) -> Path:
    """DCP shards of the policy, optimizer, teacher and reference (every rank), plus rank 0's RNG streams
    and trainer state (``state.pt``), published atomically as ``checkpoints/step-N``."""
    from cadenza.pretrain import checkpoint as dcp_ckpt
    from cadenza.rl.train.checkpoint import arch_of, rng_state

    def extra(tmp: Path) -> None:
        torch.save({"rng": rng_state(), "trainer": state}, tmp / "state.pt")

    meta = {
        "format": "dcp",
        "fingerprint": dcp_ckpt.fingerprint(trainer.model),
        "world_size": trainer.dp.world,
        "modules": sorted(trainer.shards.modules),
        "arch": arch_of(trainer.model),
    }
    return dcp_ckpt.save(
        trainer.out / "checkpoints", trainer.step, trainer.model, trainer.optimizer, meta,
        keep=trainer.cfg.run.keep_checkpoints, modules=trainer.shards.modules, extra=extra,
    )  # fmt: skip


def load_checkpoint(
    path: Path, model: torch.nn.Module, optimizer: Any, *, modules: dict[str, torch.nn.Module]
) -> tuple[int, dict[str, Any]]:
    """Restore a sharded checkpoint at any world size and dims (DCP reshards); ``(step, trainer state)``."""
    from cadenza import checkpoint as lifecycle
    from cadenza.pretrain import checkpoint as dcp_ckpt
    from cadenza.rl.train.checkpoint import set_rng_state

    meta = lifecycle.require_meta(path)
    if meta.get("format") != "dcp":
        raise ConfigError(
            f"checkpoint {path} was written by one process (safetensors); resume it with one process, or "
            "start this sharded run in another run.out_dir"
        )
    dcp_ckpt.check_compatible(meta, dcp_ckpt.fingerprint(model), path)
    dcp_ckpt.load(path, model, optimizer, modules=modules)
    state = torch.load(path / "state.pt", weights_only=False)
    set_rng_state(state["rng"])
    return int(meta["step"]), state["trainer"]
