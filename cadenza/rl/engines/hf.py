"""The ``hf`` engine: the in-process :class:`HFPolicy` sampler behind the engine seam.

It keeps its own copy of the model (a deep copy, or one built from a path/config), so
:meth:`HFEngine.sync_weights` really loads the trainer's new weights, exactly as a served engine
must: sampling with stale weights between syncs is what asynchronous training relies on.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence

import torch

from cadenza.errors import CadenzaError
from cadenza.rl.engines.weights import engine_names
from cadenza.rl.policy import HFPolicy, Sample, SamplingParams


class HFEngine:
    """Samples with a private copy of a HF model; ``sync_weights`` copies named tensors into it."""

    name = "hf"

    def __init__(self, policy: HFPolicy, *, copy_model: bool = True, version: int = 0) -> None:
        model = copy.deepcopy(policy.model) if copy_model else policy.model
        model.requires_grad_(False)
        self.policy = HFPolicy(model, device=policy.device)
        self._version = version
        self._params = dict(model.named_parameters())
        self._params.update(dict(model.named_buffers()))
        # per-expert names (what engine_names emits) are views of the stacked parameters: both forms load
        self._params.update(dict(engine_names(list(self._params.items()))))
        self._closed = False

    @property
    def version(self) -> int:
        return self._version

    def sample(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        generator: torch.Generator | None = None,
    ) -> list[Sample]:
        if self._closed:
            raise CadenzaError("engine 'hf' is closed; create a new engine")
        out = self.policy.sample(prompts, params, generator=generator)
        for s in out:
            s.policy_version = self._version
        return out

    @torch.no_grad()
    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], *, version: int) -> None:
        """Copy each tensor into the parameter of the same HF name (stacked experts accept both forms)."""
        if self._closed:
            raise CadenzaError("engine 'hf' is closed; create a new engine")
        for name, t in named_tensors:
            target = self._params.get(name)
            if target is None:
                raise CadenzaError(
                    f"engine 'hf': the model has no weight named {name!r}; sync weights of the same architecture"
                )
            if target.shape != t.shape:
                raise CadenzaError(
                    f"engine 'hf': weight {name} has shape {tuple(t.shape)}, the engine's model "
                    f"{tuple(target.shape)}; sync weights of the same architecture"
                )
            target.copy_(t.to(device=target.device, dtype=target.dtype))
        self._version = version

    def close(self) -> None:
        self._closed = True
