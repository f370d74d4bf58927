"""Checks that a weight sync really landed: the tensors the engine received, and an optional parity probe.

A sync that silently loads fewer tensors (a truncated bucket, a name the engine's loader skipped) leaves
the engine sampling from a mix of two policies while reporting the new version. :func:`check_received`
compares what the trainer sent with what the engine's worker read and names the first difference.
:class:`ParityProbe` (``rollout.sync_probe_tol > 0``) scores one fixed sequence on the engine and on
the trainer's weights after every sync and stops the run with one line when they differ beyond the
tolerance (kernel drift in fp32 is ~1e-6; a stale or half-loaded engine is off by 0.1 and more).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch

from cadenza.errors import EngineError

PROBE_TEXT = "def add(a, b):\n    # the sum of two numbers\n    return a + b\n\nprint(add(2, 3))\n"


def check_received(sent: Sequence[str], result: dict[str, Any]) -> None:
    """Raise :class:`EngineError` unless the worker read exactly the tensors named in ``sent``."""
    names = result.get("names")
    count = int(result.get("tensors", -1 if names is None else len(names)))
    if names is None:  # an older worker extension reports the count only
        if count != len(sent):
            raise EngineError(
                f"engine 'vllm' weight sync: sent {len(sent)} tensors, the engine received {count}; "
                "restart the run (the engine holds a mix of two versions)"
            )
        return
    left = Counter(names)  # each bucket file lists its tensors sorted: compare as multisets
    missing = None
    for name in sent:
        if left[name] < 1:
            missing = missing or name
        else:
            left[name] -= 1
    extra = next((n for n, c in left.items() if c > 0), None)
    if missing is None and extra is None:
        return
    what = f"{missing!r} was sent but not received" if missing else f"{extra!r} was received but not sent"
    raise EngineError(
        f"engine 'vllm' weight sync: sent {len(sent)} tensors, the engine received {len(names)}; first "
        f"mismatch: {what}; restart the run (the engine holds a mix of two versions)"
    )


class ParityProbe:
    """Scores :data:`PROBE_TEXT` on the engine and on the trainer's (unsharded) policy after a sync."""

    def __init__(self, tokenizer: Any, tol: float, *, max_tokens: int = 32) -> None:
        self.tol = float(tol)
        ids = list(tokenizer.encode(PROBE_TEXT, add_special_tokens=False))[:max_tokens]
        if len(ids) < 2:
            raise EngineError("the sync parity probe needs a tokenizer that encodes its probe text")
        self.ids = ids
        self.last_gap = 0.0

    @torch.no_grad()
    def trainer_logprobs(self, model: torch.nn.Module) -> torch.Tensor:
        """Log-probs of tokens 1..T-1 under ``model`` (temperature 1, as the engine scores them)."""
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        try:
            logits = model(torch.tensor([self.ids], device=device)).logits[0, :-1].double()
        finally:
            model.train(was_training)
        target = torch.tensor(self.ids[1:], device=device)[:, None]
        return logits.log_softmax(-1).gather(-1, target)[:, 0].cpu()

    def check(
        self, engine: Any, model: torch.nn.Module | None, version: int, *, want: torch.Tensor | None = None
    ) -> float:
        """The largest log-prob gap after the sync of ``version``; :class:`EngineError` beyond ``tol``.
        ``want``: the trainer's log-probs already computed (a sharded policy scores on every rank)."""
        score = getattr(engine, "score", None)
        if not callable(score):
            raise EngineError(
                f"engine {getattr(engine, 'name', type(engine).__name__)!r} cannot score sequences; set "
                "rollout.sync_probe_tol = 0 for it"
            )
        got = torch.tensor(score([self.ids])[0], dtype=torch.float64)
        if want is None:
            assert model is not None
            want = self.trainer_logprobs(model)
        gap = float((got - want).abs().max()) if got.shape == want.shape else float("inf")
        self.last_gap = gap
        if not gap <= self.tol:
            raise EngineError(
                f"after the weight sync to version {version} the engine's log-probs differ from the "
                f"trainer's by {gap:.3g} (> rollout.sync_probe_tol = {self.tol:g}): the engine does not "
                "hold the trainer's weights; see the engine log"
            )
        return gap
