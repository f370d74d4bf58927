"""The hint-following diagnostic: does the teacher still use the hint?

Self-distillation trains the student's *un-hinted* context toward the teacher's *hinted* one. With a
live teacher (the student itself) that training also wears away the model's use of the hint, and the
worn-away distribution becomes the target (docs/experiments.md). This module measures it directly:
on a fixed held-out probe set of (context, hint, correct action) items it computes, for the teacher
and the student, the probability of the correct action with and without the hint,

    P(correct | context + hint)  and  P(correct | context),

as the mean over items of ``exp(sum of the action's token log-probs)``. Erosion shows as a falling
``probe_teacher_hinted`` curve; a healthy run shows ``probe_student_unhinted`` rising toward it.

Probe items come from the env source (``source.probe_items(n, seed)``, e.g. toolworld) or from a JSONL
file (``[probe] path``: one ``{"messages": [...], "hint": "...", "target": {assistant message}}`` per
line). The hint is inserted exactly as the teacher inserts it (``feedback.placement``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from cadenza.errors import CadenzaError, ConfigError
from cadenza.rl.learn.logprobs import token_logprobs
from cadenza.rl.learn.sft import encode_messages
from cadenza.rl.text.tokens import collate

if TYPE_CHECKING:
    from cadenza.rl.config import TrainConfig

KEYS = ("probe_teacher_hinted", "probe_teacher_unhinted", "probe_student_hinted", "probe_student_unhinted")


class HintFollowingEroded(CadenzaError):
    """The teacher's P(correct action | hint) fell below the configured fraction of its first value."""


@dataclass(kw_only=True)
class ProbeItem:
    """One held-out decision: the context before a turn, the hint for it, and the correct assistant turn."""

    messages: list[dict[str, Any]]
    hint: str
    target: dict[str, Any]  # an OpenAI assistant message (e.g. the correct tool call)
    tools: list[dict[str, Any]] | None = None  # schemas rendered into the prompt (None: none shown)


def hinted_messages(messages: Sequence[dict[str, Any]], hint: str, placement: str) -> list[dict[str, Any]]:
    """The context with the hint inserted as the teacher inserts it (see :mod:`cadenza.rl.learn.teacher`)."""
    msgs = [dict(m) for m in messages]
    if placement == "user_before_turn":
        return [*msgs, {"role": "user", "content": hint}]
    if placement == "none":
        return msgs
    if placement == "append_to_observation":
        msgs[-1]["content"] = f"{msgs[-1].get('content') or ''}\n\n{hint}"
        return msgs
    raise CadenzaError(f"unknown hint placement {placement!r}")


def load_probe_file(path: str | Path) -> list[ProbeItem]:
    """Probe items from JSONL; a malformed line is a one-line ConfigError naming it."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"probe.path {str(path)!r} does not exist; point it at a JSONL file of probe items")
    items = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            items.append(
                ProbeItem(messages=d["messages"], hint=d["hint"], target=d["target"], tools=d.get("tools"))
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{path}:{n}: not a probe item ({exc}); need messages, hint, target") from None
    if not items:
        raise ConfigError(f"probe.path {str(path)!r} holds no probe items")
    return items


class HintProbe:
    """Encodes the probe set once; :meth:`measure` scores a student and a teacher model on it."""

    def __init__(self, items: Sequence[ProbeItem], tokenizer: Any, *, placement: str = "user_before_turn"):
        if not items:
            raise CadenzaError("the hint-following probe needs at least one item")
        self.batches = {}
        for hinted in (True, False):
            trajs = []
            for it in items:
                msgs = hinted_messages(it.messages, it.hint, placement) if hinted else list(it.messages)
                trajs.append(encode_messages(tokenizer, [*msgs, it.target], it.tools))
            self.batches[hinted] = (collate(trajs, tokenizer.pad_token_id), [t.turn_spans[-1] for t in trajs])

    @torch.no_grad()
    def probability(self, model: torch.nn.Module, hinted: bool) -> float:
        """Mean over items of P(target turn | context [+ hint]) under ``model``."""
        batch, spans = self.batches[hinted]
        device = next(model.parameters()).device
        ids, attn = batch.input_ids.to(device), batch.attention_mask.to(device)
        was_training = model.training
        model.eval()
        try:
            hidden = model.get_decoder()(input_ids=ids, attention_mask=attn).last_hidden_state
        finally:
            model.train(was_training)
        probs = []
        for row, (s, e) in enumerate(spans):
            lp, _ = token_logprobs(hidden[row, s - 1 : e - 1], model.get_output_embeddings(), ids[row, s:e])
            probs.append(math.exp(float(lp.sum())))
        return sum(probs) / len(probs)

    def measure(self, student: torch.nn.Module, teacher: torch.nn.Module) -> dict[str, float]:
        """The four numbers (a live teacher is the student: its numbers equal the student's)."""
        out = {}
        for who, model in (("teacher", teacher), ("student", student)):
            for hinted in (True, False):
                out[f"probe_{who}_{'hinted' if hinted else 'unhinted'}"] = self.probability(model, hinted)
        return out


class ProbeSchedule:
    """When to measure, the stop rule, and the first value the rule compares against (kept across resumes).

    ``every`` = 0 switches it off. Measured on the weights *entering* a step, so step 1's row holds the
    initial policy's numbers. ``stop_ratio`` > 0 stops the run once the teacher's P(correct | hint)
    falls below ``stop_ratio`` times its first measured value.
    """

    def __init__(
        self,
        probe: HintProbe | None,
        *,
        every: int,
        stop_ratio: float = 0.0,
        history: Sequence[dict[str, Any]] = (),
    ):
        self.probe = probe if every > 0 else None
        self.every = every
        self.stop_ratio = stop_ratio
        first = next((r for r in history if r.get("probe_teacher_hinted") is not None), None)
        self.baseline = float(first["probe_teacher_hinted"]) if first else None

    def measure(self, done_steps: int, student: torch.nn.Module, teacher: torch.nn.Module) -> dict[str, Any]:
        """The diagnostic's metrics when due (``done_steps`` updates applied so far), else ``{}``."""
        if self.probe is None or done_steps % self.every:
            return {}
        row: dict[str, Any] = {"probe_weights_step": done_steps, **self.probe.measure(student, teacher)}
        if self.baseline is None:
            self.baseline = row["probe_teacher_hinted"]
        return row

    def check(self, row: dict[str, Any]) -> None:
        """Raise :class:`HintFollowingEroded` if ``row``'s teacher number crossed the stop threshold."""
        value = row.get("probe_teacher_hinted")
        if not self.stop_ratio or value is None or not self.baseline:
            return
        if value < self.stop_ratio * self.baseline:
            raise HintFollowingEroded(
                f"hint-following eroded: teacher P(correct | hint) = {value:.3f} after "
                f"{row['probe_weights_step']} "
                f"steps, below {self.stop_ratio} x its first value {self.baseline:.3f}; use a frozen, ema or "
                "snapshot teacher ([teacher] weights), or raise probe.stop_ratio (0 = never stop)"
            )


def schedule_for_run(
    cfg: TrainConfig, source: Any, tokenizer: Any, history: Sequence[dict[str, Any]]
) -> ProbeSchedule:
    """The trainer's probe from ``[probe]``: items from ``probe.path`` or the env source, else switched
    off."""
    pc = cfg.probe
    if pc.every <= 0:
        return ProbeSchedule(None, every=0)
    if pc.path:
        items = load_probe_file(pc.path)[: pc.items]
    elif callable(getattr(source, "probe_items", None)):
        items = list(source.probe_items(pc.items, pc.seed))
    else:  # this env offers no probe and none was given: nothing to measure
        return ProbeSchedule(None, every=0)
    probe = HintProbe(items, tokenizer, placement=cfg.feedback.placement)
    return ProbeSchedule(probe, every=pc.every, stop_ratio=pc.stop_ratio, history=history)
