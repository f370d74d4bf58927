"""Stream a trainer's weights to an engine: one full tensor at a time, in size-bounded buckets.

A weight sync must never build the whole state dict in memory: :func:`named_full_tensors` walks the
module's parameters and buffers, gathers each FSDP2/DTensor shard to a full tensor on its own
(``DTensor.full_tensor()``), and yields it under its HF name; :func:`engine_names` renames what the
engine's loader expects (transformers 5 stacks routed experts as 3-D parameters, vLLM loads the
checkpoint format with one ``gate_proj`` / ``up_proj`` / ``down_proj`` per expert); :func:`buckets`
groups the stream into chunks of at most ``bucket_bytes`` so each engine call carries a bounded payload.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import torch

from cadenza.errors import CadenzaError

DEFAULT_BUCKET_BYTES = 256 << 20

_STACKED = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<kind>gate_up_proj|down_proj)$")


def _full(t: torch.Tensor) -> torch.Tensor:
    """The full (unsharded) value of a parameter, gathered collectively when it is a DTensor."""
    data = t.detach()
    full_tensor = getattr(data, "full_tensor", None)
    if callable(full_tensor):  # DTensor (FSDP2 / TP shard): every rank of its mesh must call this
        data = full_tensor()
    return data


def named_full_tensors(
    module: torch.nn.Module, *, buffers: bool = False, dtype: torch.dtype | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(HF name, full tensor)`` for each parameter (and persistent buffer when asked), one at a time.

    Tied parameters appear once, under their first name (``named_parameters`` de-duplicates); engines
    re-derive the tied copy. With FSDP2 every rank must iterate (each ``full_tensor()`` is a collective);
    only one full tensor exists at a time.
    """
    items: Iterable[tuple[str, torch.Tensor]] = module.named_parameters()
    if buffers:
        non_persistent = {
            f"{prefix}.{name}" if prefix else name
            for prefix, mod in module.named_modules()
            for name in getattr(mod, "_non_persistent_buffers_set", ())
        }
        items = [*items, *((n, b) for n, b in module.named_buffers() if n not in non_persistent)]
    for name, t in items:
        full = _full(t)
        if dtype is not None and full.is_floating_point():
            full = full.to(dtype)
        yield name, full


def engine_names(named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """Rename stacked MoE experts into the per-expert checkpoint names vLLM's loaders read.

    ``…experts.gate_up_proj [E, 2I, H]`` → ``…experts.{e}.gate_proj.weight [I, H]`` and
    ``…experts.{e}.up_proj.weight`` (gate first, as transformers' ``chunk(2)`` reads it);
    ``…experts.down_proj [E, H, I]`` → ``…experts.{e}.down_proj.weight [H, I]``. Other names pass unchanged.
    """
    for name, t in named:
        m = _STACKED.match(name)
        if m is None or t.dim() != 3:
            yield name, t
            continue
        prefix, kind = m["prefix"], m["kind"]
        if kind == "gate_up_proj":
            if t.shape[1] % 2:
                raise CadenzaError(f"{name} has an odd fused dimension {t.shape[1]}; expected [E, 2I, H]")
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                yield f"{prefix}.{e}.gate_proj.weight", t[e, :inter]
                yield f"{prefix}.{e}.up_proj.weight", t[e, inter:]
        else:
            for e in range(t.shape[0]):
                yield f"{prefix}.{e}.down_proj.weight", t[e]


def buckets(
    named: Iterable[tuple[str, torch.Tensor]], *, bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group a tensor stream into lists of at most ``bucket_bytes`` (a larger tensor travels alone)."""
    if bucket_bytes < 1:
        raise CadenzaError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in named:
        nbytes = t.numel() * t.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += nbytes
    if bucket:
        yield bucket


def to_safetensors_bytes(bucket: list[tuple[str, torch.Tensor]]) -> bytes:
    """Serialise one bucket (contiguous CPU copies; views of a stacked tensor are split off)."""
    from safetensors.torch import save

    return save({name: t.detach().to("cpu").contiguous().clone() for name, t in bucket})
