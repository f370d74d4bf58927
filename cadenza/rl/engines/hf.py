"""The ``hf`` engine: the in-process :class:`HFPolicy` sampler behind the engine seam.

With ``share=True`` it samples with the trainer's own module (synchronous training: the weights are
already there, a sync only moves the version). Otherwise it keeps its own copy, so
:meth:`HFEngine.sync_weights` really loads the trainer's new weights, exactly as a served engine
must: sampling with stale weights between syncs is what asynchronous training relies on.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

import torch

from cadenza.errors import CadenzaError
from cadenza.rl.engines.policy import HFPolicy, Sample, SampleRequest
from cadenza.rl.engines.weights import engine_names


class WeightTable:
    """Where each streamed name lands: parameters and buffers by HF name, stacked MoE experts also by
    the per-expert names :func:`engine_names` emits (views of the stacked tensor)."""

    def __init__(self, model: torch.nn.Module) -> None:
        params = dict(model.named_parameters())
        self.required = set(params)  # a full sync must cover every parameter
        self.targets: dict[str, torch.Tensor] = {**params, **dict(model.named_buffers())}
        self.parent: dict[str, str] = {}
        for name, p in params.items():
            for view_name, view in engine_names([(name, p)]):
                if view_name != name:
                    self.targets[view_name] = view
                    self.parent[view_name] = name

    @torch.no_grad()
    def load(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy a full weight stream in place, checking names, shapes and that nothing was left out."""
        seen: set[str] = set()
        for name, t in named_tensors:
            target = self.targets.get(name)
            if target is None:
                raise CadenzaError(
                    f"engine 'hf': the model has no weight named {name!r}; sync weights of the same "
                    "architecture"
                )
            if target.shape != t.shape:
                raise CadenzaError(
                    f"engine 'hf': weight {name} has shape {tuple(t.shape)}, the engine's model "
                    f"{tuple(target.shape)}; sync weights of the same architecture"
                )
            if target.data_ptr() != t.data_ptr():  # a shared module already holds the trainer's tensor
                target.copy_(t.to(device=target.device, dtype=target.dtype))
            seen.add(self.parent.get(name, name))
        missing = sorted(self.required - seen)
        if missing:
            raise CadenzaError(
                f"engine 'hf': weight sync left {len(missing)} tensor(s) out, e.g. {missing[0]!r}"
            )


class HFEngine:
    """Samples with a HF model in this process, stamped with the policy version."""

    name = "hf"
    fixed_batches = True  # an HF forward's numerics move with the batch (HFPolicy.fixed_batches)

    def __init__(self, policy: HFPolicy, *, share: bool = False, version: int = 0) -> None:
        if share:
            self.policy = policy
        else:
            model = copy.deepcopy(policy.model)
            model.requires_grad_(False)
            self.policy = HFPolicy(model, device=policy.device)
        self._table = WeightTable(self.policy.model)
        self._version = int(version)
        self._closed = False

    @property
    def version(self) -> int:
        return self._version

    def sample(self, request: SampleRequest) -> list[Sample]:
        if self._closed:
            raise CadenzaError("engine 'hf' is closed; create a new engine")
        version = self._version
        out = self.policy.sample(request)
        for s in out:
            s.policy_version = version
        return out

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], *, version: int) -> None:
        if self._closed:
            raise CadenzaError("engine 'hf' is closed; create a new engine")
        self._table.load(named_tensors)
        self._version = int(version)

    def close(self) -> None:
        self._closed = True
