"""Is the change targeted? Held-out measures of what the tool-list hint does *not* address.

On the held-out rollouts of one evaluation (:func:`cadenza.experiments.heldout.evaluate`):

* ``other_error_rates``: per turn, the rate of each error kind the hint does not name (every kind but
  ``tool_not_found``; ``no_call`` = a turn without a tool call);
* ``unhinted_kl`` / ``unhinted_entropy``: on the model tokens of turns without a ``tool_not_found``
  error (turns the hint would never touch), the exact KL(current || start model) over the vocabulary and
  the current policy's entropy, in nats per token;
* per episode (``tool_error``, ``resolved``): the report's *clean-task success* is the final success on
  the held-out tasks whose step-0 episode had no tool error (the same tasks for every arm of a seed).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

HINT_KIND = "tool_not_found"


def other_error_rates(results: list[Any]) -> dict[str, float]:
    turns = [t for r in results for t in r.trajectory.turns]
    n = max(1, len(turns))
    kinds = Counter("no_call" if t.tool is None else t.error_kind for t in turns)
    return {k: kinds.get(k, 0) / n for k in ("invalid_arguments", "no_call")} | {
        k: c / n for k, c in kinds.items() if k not in (None, HINT_KIND, "invalid_arguments", "no_call")
    }


def episode_flags(results: list[Any]) -> dict[str, list[int]]:
    return {
        "tool_error": [int(any(t.error_kind == HINT_KIND for t in r.trajectory.turns)) for r in results],
        "resolved": [int(bool(r.outcome.get("resolved"))) for r in results],
    }


def unhinted_kl_entropy(policy: Any, start: Any, results: list[Any]) -> dict[str, float]:
    """Exact per-token KL(policy || start) and entropy of ``policy`` on un-hinted turns' model tokens."""
    import torch

    kl_sum = ent_sum = 0.0
    n = 0
    with torch.no_grad():
        for r in results:
            tok = r.tokens
            bad = {t.index for t in r.trajectory.turns if t.error_kind == HINT_KIND}
            mask = [0] * len(tok.input_ids)
            for i, (s, e) in enumerate(tok.turn_spans):
                if i not in bad:
                    mask[s:e] = tok.loss_mask[s:e]
            pos = [p - 1 for p, m in enumerate(mask) if m and p > 0]  # logits at p-1 predict token p
            if not pos:
                continue
            ids = torch.tensor([tok.input_ids], device=policy.device)
            lp = torch.log_softmax(policy.model(input_ids=ids).logits[0, pos].float(), -1)
            lq = torch.log_softmax(start.model(input_ids=ids.to(start.device)).logits[0, pos].float(), -1)
            p = lp.exp()
            kl_sum += float((p * (lp - lq.to(lp.device))).sum())
            ent_sum += float(-(p * lp).sum())
            n += len(pos)
    nan = float("nan")
    return {"unhinted_kl": kl_sum / n if n else nan, "unhinted_entropy": ent_sum / n if n else nan}


def clean_success(evals: list[dict[str, Any]]) -> float | None:
    """Final success on the tasks whose step-0 episode had no tool error (None if there are none)."""
    first, last = evals[0], evals[-1]
    if "tool_error" not in first or "resolved" not in last:
        return None
    clean = [i for i, e in enumerate(first["tool_error"]) if not e]
    return sum(last["resolved"][i] for i in clean) / len(clean) if clean else None
