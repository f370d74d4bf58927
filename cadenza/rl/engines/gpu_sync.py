"""GPU weight sync through vLLM's native weight-transfer API (NCCL to an engine on other GPUs, CUDA IPC
when colocated). GPU-only: on CPU the worker extension path (:mod:`cadenza.rl.engines.vllm_ext`) is used.

The engine server is started with ``--weight-transfer-config '{"backend": "nccl"}'`` (see
:func:`server_args`); the trainer side is vLLM's own trainer engine (so the trainer env needs vLLM:
``python -m cadenza.rl.engines.install --same-env``), fed by :class:`ModuleWeights` through a
``WeightSource`` whose names are what vLLM's loader reads (stacked MoE experts split per expert, as
:func:`~cadenza.rl.engines.weights.engine_names` does) and whose metadata is read without gathering.
The HTTP control plane (init, start, update, finish) goes through vLLM's ``HTTPVLLMWeightSyncClient``
with a timeout; a transfer that fails raises a one-line :class:`EngineError`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from cadenza.errors import CadenzaError, EngineError
from cadenza.rl.engines.weights import _STACKED, engine_names, named_full_tensors

BACKENDS = ("nccl", "ipc")


def server_args(backend: str) -> list[str]:
    """Extra vLLM server arguments that enable the native transfer backend."""
    if backend not in BACKENDS:
        raise CadenzaError(f"native weight transfer backend must be one of {BACKENDS}, got {backend!r}")
    return ["--weight-transfer-config", json.dumps({"backend": backend})]


class ModuleWeights:
    """A trainer module's weights as the engine loads them: metadata without gathering, then a stream.

    Iterating yields ``(engine name, full tensor)`` one at a time (FSDP2/DTensor shards gathered per
    tensor: every rank must iterate). :meth:`metadata` lists the same names, dtypes and shapes in the
    same order, read from the (global) parameter shapes, so no communication happens.
    """

    def __init__(self, module: torch.nn.Module, *, dtype: torch.dtype | None = None) -> None:
        self.module = module
        self.dtype = dtype

    def metadata(self) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        out = []
        for name, p in self.module.named_parameters():
            dtype = self.dtype if self.dtype is not None and p.is_floating_point() else p.dtype
            shape = tuple(p.shape)
            m = _STACKED.match(name)
            if m is None or len(shape) != 3:
                out.append((name, dtype, shape))
            elif m["kind"] == "gate_up_proj":
                half = (shape[1] // 2, shape[2])
                for e in range(shape[0]):
                    out += [(f"{m['prefix']}.{e}.gate_proj.weight", dtype, half)]
                    out += [(f"{m['prefix']}.{e}.up_proj.weight", dtype, half)]
            else:
                out += [(f"{m['prefix']}.{e}.down_proj.weight", dtype, shape[1:]) for e in range(shape[0])]
        return out

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return engine_names(named_full_tensors(self.module, dtype=self.dtype))


class ShardStream(ModuleWeights):
    """One pass over a sharded module's full tensors, under the engine's names (collective per tensor).

    Iterating it continues where the last iteration stopped, so :meth:`drain` after a partial read (an
    engine error) runs the remaining collectives; :class:`ModuleWeights`' metadata (names, dtypes, global
    shapes) lets vLLM's native NCCL / IPC transfer consume it too.
    """

    def __init__(self, module: torch.nn.Module, *, dtype: torch.dtype | None = None) -> None:
        super().__init__(module, dtype=dtype)
        self._source: Iterator[tuple[str, torch.Tensor]] | None = None
        self.gathered = 0  # full tensors gathered so far (the same on every rank once drained)

    def _tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        if self._source is None:
            self._source = self._counted()
        return self._source

    def _counted(self) -> Iterator[tuple[str, torch.Tensor]]:
        for item in named_full_tensors(self.module, dtype=self.dtype):
            self.gathered += 1
            yield item

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return engine_names(self._tensors())

    def drain(self) -> None:
        """Gather (and drop) whatever is left: every rank ends the pass with the same collectives."""
        for _ in self._tensors():
            pass


def weight_source(weights: ModuleWeights | Any) -> Any:
    """Wrap :class:`ModuleWeights` as vLLM's ``WeightSource`` (imports vLLM: GPU trainer env only).
    ``weights`` may be a zero-argument callable returning the current :class:`ModuleWeights`: each push
    then reads that sync's stream (a :class:`ShardStream` is read once)."""
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    current = weights if callable(weights) else (lambda: weights)

    class _Source(WeightSource):
        def metadata(self) -> list[Any]:
            return [ParamMeta(n, d, s) for n, d, s in current().metadata()]

        def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
            return iter(current())

    return _Source()


@dataclass(kw_only=True)
class NativeSyncConfig:
    """The trainer side of one native transfer group."""

    backend: str = "nccl"  # "nccl" (engine on other GPUs) or "ipc" (same GPU as the trainer)
    master_address: str = "127.0.0.1"  # NCCL rendezvous (TCPStore) address
    master_port: int = 0  # NCCL rendezvous port; 0 = pick a free one
    world_size: int = 2  # trainer sender + the engine's workers (1 + tensor-parallel size)
    rank: int = 0  # this trainer rank; rank 0 sends, the others only join the gather
    timeout_s: float = 300.0  # every control-plane HTTP call

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise CadenzaError(
                f"native weight transfer backend must be one of {BACKENDS}, got {self.backend!r}"
            )
        if self.world_size < 2:
            raise CadenzaError(
                f"world_size counts the trainer and the engine workers: >= 2, got {self.world_size}"
            )


class NativeWeightSync:
    """Push weights into a running vLLM server with its native transfer engine (one group, many pushes)."""

    def __init__(self, base_url: str, weights: ModuleWeights, config: NativeSyncConfig) -> None:
        if not torch.cuda.is_available():
            raise CadenzaError(
                "vLLM's native weight transfer needs CUDA; on CPU the vllm engine syncs through its worker "
                "extension (weight_transfer='worker')"
            )
        try:
            from vllm.distributed.weight_transfer import clients, ipc_engine, nccl_engine
        except ImportError:
            raise CadenzaError(
                "native weight transfer needs vLLM in the trainer env: python -m cadenza.rl.engines.install "
                "--same-env (or use weight_transfer='worker')"
            ) from None
        self.base_url = base_url
        self.weights = weights  # what the next push streams (see :meth:`push`)
        client = clients.HTTPVLLMWeightSyncClient(base_url, timeout=config.timeout_s)
        source = weight_source(lambda: self.weights)
        try:
            if config.backend == "nccl":
                port = config.master_port or _free_port(config.master_address)
                info = nccl_engine.NCCLTrainerInitInfo(
                    rank=config.rank,
                    master_address=config.master_address,
                    master_port=port,
                    world_size=config.world_size,
                )
                self.engine = nccl_engine.NCCLTrainerWeightTransferEngine.trainer_init(
                    info, client=client, source=source
                )
            else:
                info = ipc_engine.IPCTrainerInitInfo(rank=config.rank)
                self.engine = ipc_engine.IPCTrainerWeightTransferEngine.trainer_init(
                    info, client=client, source=source
                )
        except Exception as e:
            raise EngineError(f"engine 'vllm' native weight transfer init failed: {_one_line(e)}") from None

    def push(self, weights: ModuleWeights | None = None) -> None:
        """Send ``weights`` (this sync's stream; default: the ones given at init, read again)."""
        if weights is not None:
            self.weights = weights
        try:
            self.engine.send_weights()
        except Exception as e:
            raise EngineError(f"engine 'vllm' native weight transfer failed: {_one_line(e)}") from None

    def close(self) -> None:
        shutdown = getattr(self.engine, "shutdown", None)
        if callable(shutdown):
            shutdown()


def _free_port(host: str) -> int:
    from cadenza.rl.engines.vllm_server import free_port

    return free_port(host)


def _one_line(e: BaseException) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())[:300]
