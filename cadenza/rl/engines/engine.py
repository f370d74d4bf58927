"""The rollout-engine seam: what the rollout loop and the trainer need from whatever samples tokens.

Three backends implement :class:`RolloutEngine`: ``hf`` (the in-process :class:`HFPolicy` sampler,
for tiny tests), ``vllm`` (a vLLM server that cadenza starts, health-checks, syncs and stops) and
``openai`` (any OpenAI-compatible server that returns token ids; no weight sync). The contract is
token-in / token-out: prompts are token ids (never re-rendered text) and each :class:`Sample` carries
the sampled ids with their behaviour log-probs under the distribution actually sampled from
(temperature applied), plus the policy version of the weights that produced it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable

import torch

from cadenza.rl.engines.policy import Policy

ENGINES = ("hf", "vllm", "openai")


@runtime_checkable
class RolloutEngine(Policy, Protocol):
    """A :class:`Policy` (``sample(request)``) that also accepts new weights in place.

    ``request.generator`` seeds the draw (engines derive per-request seeds from it). An engine whose
    samples move with the batch they run in (the in-process HF forward) sets ``fixed_batches = True``,
    and the rollout then gives it the same batches whatever the timing (``rl/rollout/turn_batcher.py``).
    """

    name: str

    @property
    def version(self) -> int:
        """Policy version of the weights the engine samples with now (0 = initial weights)."""

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], *, version: int) -> None:
        """Load new weights (HF parameter names, full tensors, streamed) without restarting the engine.

        Raises :class:`cadenza.errors.CadenzaError` (one line naming the engine and its log) when the
        engine does not confirm in time; never hangs.
        """

    def close(self) -> None:
        """Stop anything the engine started (processes, servers); idempotent."""
