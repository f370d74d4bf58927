"""The trainer's in-process ``hf`` engine and the one place the trainer obtains an engine.

:class:`LocalHFEngine` implements :class:`cadenza.rl.engine.RolloutEngine` over an :class:`HFPolicy`.
With ``share=True`` it samples with the trainer's own module (synchronous training: the weights are
already there, a sync only moves the version); otherwise it holds its own copy, which
:meth:`sync_weights` overwrites in place, so rollouts can run while the trainer updates its weights.

``vllm`` and ``openai`` come from :func:`cadenza.rl.engines.make_engine` (the engine package).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from cadenza.errors import CadenzaError, ConfigError
from cadenza.rl.policy import HFPolicy, Sample, SamplingParams


class LocalHFEngine:
    """HF ``generate``-style sampling in this process, stamped with the policy version."""

    name = "hf"

    def __init__(self, policy: HFPolicy, *, share: bool, version: int = 0) -> None:
        if share:
            self.policy = policy
        else:
            model = copy.deepcopy(policy.model)
            model.requires_grad_(False)
            self.policy = HFPolicy(model, device=policy.device)
        self._params = dict(self.policy.model.named_parameters())
        self._version = int(version)

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
        version = self._version
        out = self.policy.sample(prompts, params, generator=generator)
        for s in out:
            s.policy_version = version
        return out

    @torch.no_grad()
    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], *, version: int) -> None:
        seen = set()
        for name, tensor in named_tensors:
            param = self._params.get(name)
            if param is None:
                raise CadenzaError(f"engine 'hf': weight sync sent {name!r}, which the engine's model lacks")
            if param.shape != tensor.shape:
                raise CadenzaError(
                    f"engine 'hf': weight sync sent {name!r} with shape {tuple(tensor.shape)}, "
                    f"the engine holds {tuple(param.shape)}"
                )
            if param.data_ptr() != tensor.data_ptr():  # shared module: already the trainer's tensor
                param.copy_(tensor)
            seen.add(name)
        missing = sorted(set(self._params) - seen)
        if missing:
            raise CadenzaError(
                f"engine 'hf': weight sync left {len(missing)} tensor(s) out, e.g. {missing[0]!r}"
            )
        self._version = int(version)

    def close(self) -> None:
        pass


def build_engine(cfg: Any, policy: HFPolicy, tokenizer: Any, *, version: int) -> Any:
    """The engine named by ``[rollout] engine`` (a :class:`RolloutEngine`), at ``version``.

    ``hf`` shares the trainer's module when training is synchronous (``max_staleness = 0``: the old
    loop, bit for bit) and keeps its own copy otherwise. The served engines are built by
    ``cadenza.rl.engines.make_engine`` and brought to the trainer's weights by the caller's first sync.
    """
    r = cfg.rollout
    if r.executor == "ray":  # the actors hold the engines; they receive weights through sync_weights
        from cadenza.executor import ExecutorConfig
        from cadenza.rl.workers import RayWorkers

        ex = ExecutorConfig(kind="ray", ray_address=r.ray_address, workers=r.workers, run_dir=None)
        return RayWorkers(cfg, r.workers, ex, timeout_s=r.engine_timeout_s)
    if r.engine == "hf":
        return LocalHFEngine(policy, share=r.max_staleness == 0, version=version)
    try:
        from cadenza.rl.engines import make_engine  # type: ignore[attr-defined]
    except ImportError:
        raise ConfigError(
            f"rollout.engine = {r.engine!r} needs the engine package (cadenza.rl.engines), which this build "
            "lacks; use engine = 'hf'"
        ) from None
    return make_engine(
        r.engine,
        model=cfg.model,
        tokenizer=tokenizer,
        endpoint=r.endpoint,
        timeout_s=r.engine_timeout_s,
        options=dict(r.engine_options),
    )
