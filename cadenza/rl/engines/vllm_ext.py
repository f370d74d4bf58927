"""cadenza's vLLM worker extension: in-place weight reload from safetensors files or bytes (CPU path).

vLLM mixes this class into its worker (``--worker-extension-cls``); the server reaches its methods
through ``POST /collective_rpc`` (``VLLM_SERVER_DEV_MODE=1``). Tensors cannot cross ``collective_rpc``
in multiprocess mode, so weights travel as safetensors files (a path, e.g. under ``/dev/shm``) or as
base64 safetensors bytes staged by the worker. After vLLM's ``reload_weights`` two gaps of 0.32.0 are
closed here: a tied ``lm_head`` is re-packed from the new embedding, and CPU MoE expert weights are
re-packed into the grouped-gemm layout (without either, log-probs are off by 0.6-1.2). The third fix,
dropping prefix-cache KV computed with old weights, is the caller's ``POST /reset_prefix_cache``.

This module is imported inside the engine process only; it needs nothing from cadenza but itself.
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch


def _iter_files(paths: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """Tensors of each file in turn, one at a time (never the whole model in memory)."""
    from safetensors import safe_open

    for path in paths:
        with safe_open(path, framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                yield name, f.get_tensor(name)


def repack_after_reload(model: torch.nn.Module, *, tied: bool) -> dict[str, int]:
    """Redo the CPU weight packing that ``reload_weights`` skips (tied LM head, MoE experts)."""
    fixed = {"lm_head": 0, "moe": 0}
    lm_head = getattr(model, "lm_head", None)
    method = getattr(lm_head, "quant_method", None)
    if tied and method is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(lm_head)
        fixed["lm_head"] = 1
    for module in model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if experts is not None and type(experts).__name__ == "CPUUnquantizedExperts":
            experts.process_weights_after_loading(module)
            fixed["moe"] += 1
    return fixed


class CadenzaWorkerExtension:
    """Methods vLLM adds to each worker (``self`` is the worker)."""

    def cadenza_reload(self, request: str) -> str:
        """Reload weights from ``{"paths": [safetensors files]}`` (or the staged bytes when omitted)."""
        t0 = time.perf_counter()
        req: dict[str, Any] = json.loads(request)
        staged = self._cadenza_staged()
        paths = list(req.get("paths") or [str(p) for p in staged])
        names: list[str] = []  # what arrived, in order: the trainer compares it with what it sent

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            for item in _iter_files(paths):
                names.append(item[0])
                yield item

        self.reload_weights(weights_iterator=counted(), is_checkpoint_format=True)
        model = self.model_runner.get_model()
        cfg = self.model_runner.model_config.hf_config
        tied = bool(getattr(getattr(cfg, "text_config", cfg), "tie_word_embeddings", False))
        fixed = repack_after_reload(model, tied=tied)
        for p in staged:
            p.unlink(missing_ok=True)
        if staged:  # nothing of a bytes sync stays in shared memory between syncs
            self._cadenza_stage_dir(create=False).rmdir()
        seconds = time.perf_counter() - t0
        return json.dumps({"tensors": len(names), "names": names, "seconds": seconds, "fixed": fixed})

    def cadenza_stage(self, b64: str) -> str:
        """Keep one bucket of base64 safetensors bytes for the next :meth:`cadenza_reload`."""
        stage = self._cadenza_stage_dir()
        path = stage / f"{len(list(stage.iterdir())):06d}.safetensors"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(base64.b64decode(b64))
        os.replace(tmp, path)
        return str(path)

    def cadenza_checksum(self, name: str) -> str:
        """Sum of one parameter of the engine's model (tests read it to see a reload land)."""
        params = dict(self.model_runner.get_model().named_parameters())
        return repr(float(params[name].detach().double().sum())) if name in params else "missing"

    def _cadenza_stage_dir(self, *, create: bool = True) -> Path:
        base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
        stage = base / f"cadenza-stage-{os.getpid()}"
        if create:
            stage.mkdir(exist_ok=True)
        return stage

    def _cadenza_staged(self) -> list[Path]:
        return sorted(self._cadenza_stage_dir(create=False).glob("*.safetensors"))
