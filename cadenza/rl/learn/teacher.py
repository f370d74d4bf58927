"""Per-turn self-distillation teachers: the same model, shown a hint, scores the student's own turn.

For a :class:`~cadenza.feedback.hints.Hint` on turn ``k`` of a token trajectory:

* **student input** = the trajectory as sampled; the target tokens are turn ``k``'s tokens;
* **teacher input** = the same prefix up to turn ``k`` with the hint inserted, followed by turn ``k``'s
  own tokens (nothing after them). Placement ``user_before_turn`` (default) inserts the hint as a user
  message right before the turn's generation prompt; ``append_to_observation`` appends it to the
  content of the message just before the turn (the tool results, or the task for turn 0) and
  re-renders that message.

Only the target turn's tokens enter the loss, so gradients reach the student only through the
logits that predict those tokens. Teacher passes run under ``no_grad``, batched with padding; with a
live teacher the prefix the student already computed is reused from the student's KV cache
(detached), so only the hint and the target turn are recomputed.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from cadenza.errors import CadenzaError
from cadenza.feedback.hints import Hint
from cadenza.rl.config import LossConfig, TeacherConfig
from cadenza.rl.learn.logprobs import hidden_divergence, token_logprobs
from cadenza.rl.learn.losses import DivergenceSpec, sampled_token_surrogate
from cadenza.rl.text.chat import render_continuation, require_chat_template, turn_end_glue
from cadenza.rl.text.tokens import Segment, TokenTrajectory

PLACEMENTS = ("user_before_turn", "append_to_observation", "none")
TEACHER_WEIGHTS = ("frozen", "ema", "snapshot", "live")
ESTIMATORS = ("full", "sampled")


@dataclass(kw_only=True)
class HintedTurn:
    """One teacher input: ``teacher_ids[:shared_prefix] == student ids[:shared_prefix]``, then the hinted
    context, then the target turn at ``teacher_ids[teacher_turn_start:]``."""

    row: int
    turn: int
    hint: Hint
    turn_start: int
    turn_end: int
    teacher_ids: list[int]
    teacher_turn_start: int
    shared_prefix: int

    @property
    def num_tokens(self) -> int:
        return self.turn_end - self.turn_start


@dataclass(kw_only=True)
class SDResult:
    loss: torch.Tensor  # mean over all hinted target tokens (0 with grad graph if there are none)
    num_tokens: int
    per_turn: list[float] = field(default_factory=list)  # detached mean divergence per HintedTurn


def merge_hints(hints: Sequence[Hint]) -> list[Hint]:
    """One hint per turn: texts of hints on the same turn are joined, so a turn is never counted twice."""
    by_turn: dict[int, list[Hint]] = {}
    for h in hints:
        by_turn.setdefault(h.turn, []).append(h)
    return [
        hs[0]
        if len(hs) == 1
        else Hint(turn=t, text="\n".join(h.text for h in hs), kind="+".join(h.kind for h in hs))
        for t, hs in sorted(by_turn.items())
    ]


def select_rows(items: Sequence[HintedTurn], rows: Sequence[int]) -> list[HintedTurn]:
    """The hinted turns of a micro-batch made of ``rows`` (in that order), with ``row`` re-indexed to it."""
    where = {r: i for i, r in enumerate(rows)}
    return [dataclasses.replace(it, row=where[it.row]) for it in items if it.row in where]


def _segment_ending_at(traj: TokenTrajectory, pos: int) -> Segment | None:
    return next((s for s in traj.segments if s.end == pos and s.end > s.start), None)


def build_hinted_turns(
    trajectories: Sequence[TokenTrajectory],
    hints: Sequence[Sequence[Hint]],
    tokenizer: Any,
    placement: str = "user_before_turn",
) -> list[HintedTurn]:
    """Teacher inputs for every hint; validates everything (CadenzaError) before any compute.

    ``hints[i]`` are the hints for ``trajectories[i]`` (``Hint.turn`` indexes its model turns).
    """
    if placement not in PLACEMENTS:
        raise CadenzaError(f"unknown hint placement {placement!r}; use one of {', '.join(PLACEMENTS)}")
    if len(hints) != len(trajectories):
        raise CadenzaError(f"got hints for {len(hints)} trajectories but {len(trajectories)} trajectories")
    require_chat_template(tokenizer)
    items: list[HintedTurn] = []
    for row, (traj, row_hints) in enumerate(zip(trajectories, hints, strict=True)):
        if not row_hints:
            continue
        traj.validate()
        for hint in merge_hints(row_hints):
            if not 0 <= hint.turn < len(traj.turn_spans):
                raise CadenzaError(
                    f"hint ({hint.kind}) points at turn {hint.turn} but trajectory {traj.group_id!r} has "
                    f"{len(traj.turn_spans)} model turns (0..{len(traj.turn_spans) - 1}); fix the hint "
                    "generator"
                )
            if not hint.text.strip():
                raise CadenzaError(f"hint ({hint.kind}) for turn {hint.turn} has empty text")
            items.append(_hinted_turn(row, traj, hint, tokenizer, placement))
    return items


def _hinted_turn(row: int, traj: TokenTrajectory, hint: Hint, tokenizer: Any, placement: str) -> HintedTurn:
    start, end = traj.turn_spans[hint.turn]
    turn_seg = next(s for s in traj.segments if s.start == start and s.kind == "assistant")
    m = turn_seg.message_index
    gen = _segment_ending_at(traj, start)
    if gen is None or gen.kind != "prompt" or gen.message_index != m or not 0 < m <= len(traj.messages):
        raise CadenzaError(
            f"trajectory {traj.group_id!r}: cannot locate the generation prompt and messages of turn "
            f"{hint.turn}; "
            "hints need trajectories produced by cadenza.rl.rollout.loop (with messages and segments)"
        )
    messages = traj.messages
    tools = traj.metadata.get("tools")
    if placement == "user_before_turn":
        text = render_continuation(
            tokenizer,
            messages[:m],
            [{"role": "user", "content": hint.text}],
            tools,
            add_generation_prompt=False,
        )
        p = q = gen.start
    elif placement == "none":  # the control with no words: the teacher reads the student's own context
        text, p, q = "", gen.start, gen.start
    else:
        prev = _segment_ending_at(traj, gen.start)
        if prev is None or prev.kind == "assistant" or not 0 <= prev.message_index < m:
            raise CadenzaError(
                f"trajectory {traj.group_id!r}: turn {hint.turn} has no preceding message to append to"
            )
        j = prev.message_index
        changed = [dict(msg) for msg in messages[j:m]]
        changed[-1]["content"] = f"{changed[-1].get('content') or ''}\n\n{hint.text}"
        glue = turn_end_glue(tokenizer, messages[:j], tools) if prev.kind == "observation" else ""
        text = glue + render_continuation(
            tokenizer, messages[:j], changed, tools, add_generation_prompt=False
        )
        p, q = prev.start, gen.start
    hint_ids = list(tokenizer.encode(text, add_special_tokens=False)) if text else []
    teacher_ids = traj.input_ids[:p] + hint_ids + traj.input_ids[q:end]
    return HintedTurn(
        row=row,
        turn=hint.turn,
        hint=hint,
        turn_start=start,
        turn_end=end,
        teacher_ids=teacher_ids,
        teacher_turn_start=p + len(hint_ids) + (start - q),
        shared_prefix=p,
    )


class Teacher:
    """Teacher weights (frozen initial copy, EMA, refreshed snapshot or live) and batched hinted passes."""

    def __init__(
        self, model: torch.nn.Module, config: TeacherConfig | None = None, loss: LossConfig | None = None
    ) -> None:
        """``config``: the run's ``[teacher]`` (which weights, refresh, logits chunk); ``loss``: its
        ``[loss]`` (divergence, top-k, temperature, token clip and estimator of the SD term)."""
        self.config = config = config or TeacherConfig()
        self.loss_config = loss = loss or LossConfig()
        if config.weights not in TEACHER_WEIGHTS:
            raise CadenzaError(
                f"unknown teacher weights {config.weights!r}; use one of {', '.join(TEACHER_WEIGHTS)}"
            )
        if config.weights == "snapshot" and config.refresh_every < 1:
            raise CadenzaError(f"teacher refresh_every must be >= 1, got {config.refresh_every}")
        if loss.sd_estimator not in ESTIMATORS:
            raise CadenzaError(
                f"unknown SD estimator {loss.sd_estimator!r}; use one of {', '.join(ESTIMATORS)}"
            )
        if loss.token_clip < 0:
            raise CadenzaError(f"token_clip must be >= 0 (0 = off), got {loss.token_clip}")
        top_k = loss.top_k or None  # 0 = the full vocabulary
        self.spec = DivergenceSpec(
            divergence=loss.divergence, beta=loss.beta, top_k=top_k, temperature=loss.sd_temperature
        )
        self.updates = 0  # optimizer steps seen (snapshot refresh clock when no step is passed)
        if config.weights == "live":
            self.model = model
        else:
            self.model = copy.deepcopy(model)
            self.model.requires_grad_(False)

    @property
    def lm_head(self) -> torch.nn.Module:
        return self.model.get_output_embeddings()

    @property
    def reuses_student_cache(self) -> bool:
        return self.config.weights == "live" and self.config.reuse_prefix_cache

    @torch.no_grad()
    def update(self, student: torch.nn.Module, step: int | None = None) -> None:
        """After an optimizer step: an EMA teacher moves toward the student; a snapshot teacher copies it
        when ``step`` (the trainer's step, so a resumed run refreshes on the same steps) is a multiple of
        ``refresh_every``; live and frozen teachers do nothing."""
        self.updates += 1
        kind = self.config.weights
        step = self.updates if step is None else step
        if kind == "ema":
            for t, s in zip(self.model.parameters(), student.parameters(), strict=True):
                t.lerp_(s.detach().to(t.dtype), 1.0 - self.config.ema_decay)
        elif kind == "snapshot" and step % self.config.refresh_every == 0:
            for t, s in zip(self.model.parameters(), student.parameters(), strict=True):
                t.copy_(s.detach().to(t.dtype))

    @torch.no_grad()
    def target_hidden(self, items: Sequence[HintedTurn], student_cache: Any = None) -> list[torch.Tensor]:
        """Teacher hidden states predicting each item's target tokens: one ``[num_tokens, D]`` per item.

        Rows of the teacher batch cover only ``teacher_ids`` (hinted prefix through the target turn).
        With ``student_cache`` (the KV cache of the student's forward over the batch, live teacher
        only) each row's shared prefix comes from the cache and only the rest is recomputed.
        """
        if not items:
            return []
        device = next(self.model.parameters()).device
        use_cache = (
            student_cache is not None
            and self.reuses_student_cache
            and min(it.shared_prefix for it in items) > 0
        )
        starts = [it.shared_prefix if use_cache else 0 for it in items]
        new = [it.teacher_ids[s:] for it, s in zip(items, starts, strict=True)]
        H, L = len(items), max(len(x) for x in new)
        P = max(starts)
        ids = torch.zeros((H, L), dtype=torch.long, device=device)
        attn = torch.zeros((H, P + L), dtype=torch.long, device=device)
        for i, (x, s) in enumerate(zip(new, starts, strict=True)):
            ids[i, : len(x)] = torch.tensor(x, dtype=torch.long)
            attn[i, :s] = 1
            attn[i, P : P + len(x)] = 1
        pos = torch.tensor(starts, device=device)[:, None] + torch.arange(L, device=device)[None]
        cache = _gather_prefix_cache(student_cache, items, starts, P) if use_cache else None
        out = self.model.get_decoder()(
            input_ids=ids, attention_mask=attn, position_ids=pos, cache=cache, use_cache=cache is not None
        )
        hidden = out.last_hidden_state
        result = []
        for i, (it, s) in enumerate(zip(items, starts, strict=True)):
            a = it.teacher_turn_start - 1 - s  # hidden at position t predicts token t + 1
            result.append(hidden[i, a : a + it.num_tokens])
        return result

    def loss(
        self,
        student_hidden: torch.Tensor,
        student_head: torch.nn.Module,
        items: Sequence[HintedTurn],
        student_cache: Any = None,
        behaviour_logprobs: torch.Tensor | None = None,
        context: Any = None,
    ) -> SDResult:
        """Mean per-token divergence over all hinted target tokens (student gets gradient, teacher none).

        ``student_hidden`` ``[B, T, D]`` are the student's final hidden states over the batch rows that
        ``items`` index (the same forward that feeds the GRPO loss). ``behaviour_logprobs`` (``[B, T]``,
        the batch's): the sampler's log-probs when it was not the student at ``sd_temperature`` (stale
        or other-kernel engine, other temperature); the ``sampled`` estimator is then importance-weighted
        by ``min(p_s / mu, is_cap)`` per token (``is_cap`` 0: uncapped), the ``full`` one needs no
        correction (it sums over the vocabulary). ``context`` (context parallelism): ``student_hidden``
        holds this rank's positions only; each rank scores the target tokens its positions predict and
        the per-token divergences are summed over the CP group (the teacher's decoder gathers its own).
        """
        cfg, lc = self.config, self.loss_config
        if not items:
            return SDResult(loss=student_hidden.sum() * 0.0, num_tokens=0)
        teacher = torch.cat(self.target_hidden(items, student_cache))
        student, keep = _student_rows(student_hidden, items, context)
        t_head = self.lm_head if cfg.weights != "live" else student_head
        if keep is not None:
            teacher = teacher[keep]
        if lc.sd_estimator == "sampled":
            targets = torch.tensor(
                [t for it in items for t in it.teacher_ids[it.teacher_turn_start :]], device=student.device
            )
            kw = dict(chunk_size=cfg.chunk_size, temperature=lc.sd_temperature)
            s_lp, _ = token_logprobs(student, student_head, _kept(targets, keep), **kw)
            with torch.no_grad():
                t_lp, _ = token_logprobs(teacher, t_head, _kept(targets, keep), **kw)
            mu = None
            if behaviour_logprobs is not None:
                mu = torch.cat([behaviour_logprobs[it.row, it.turn_start : it.turn_end] for it in items])
                mu = _kept(mu, keep)
            per_token = sampled_token_surrogate(s_lp, t_lp, mu, lc.is_cap)
        else:
            per_token = hidden_divergence(
                student,
                teacher,
                student_head,
                t_head,
                spec=self.spec,
                chunk_size=cfg.chunk_size,
            )
        if keep is not None:  # this rank's tokens in place, the others' from their ranks
            whole = per_token.new_zeros(keep.shape).index_put((keep.nonzero()[:, 0],), per_token)
            per_token = context.sum(whole)
        if lc.token_clip > 0:  # clipped tokens pass no gradient: one noisy token cannot dominate
            per_token = per_token.clamp(max=lc.token_clip)
        per_turn = [float(x.mean()) for x in per_token.detach().split([it.num_tokens for it in items])]
        return SDResult(loss=per_token.mean(), num_tokens=per_token.numel(), per_turn=per_turn)


def _kept(x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    return x if keep is None else x[keep.to(x.device)]


def _student_rows(
    hidden: torch.Tensor, items: Sequence[HintedTurn], context: Any
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The student's hidden states predicting the items' target tokens, concatenated; under context
    parallelism only those this rank holds, with ``keep`` marking which of all target tokens they are."""
    if context is None:
        return torch.cat([hidden[it.row, it.turn_start - 1 : it.turn_end - 1] for it in items]), None
    padded = hidden.shape[1] * context.size
    positions = context.positions(padded, hidden.device)
    local = torch.full((padded,), -1, dtype=torch.long, device=hidden.device)  # global -> local row
    local[positions] = torch.arange(positions.numel(), device=hidden.device)
    rows = torch.cat([torch.full((it.num_tokens,), it.row, device=hidden.device) for it in items])
    at = torch.cat([local[it.turn_start - 1 : it.turn_end - 1] for it in items])
    keep = at >= 0
    return hidden[rows[keep], at[keep]], keep


def _gather_prefix_cache(student_cache: Any, items: Sequence[HintedTurn], starts: list[int], P: int) -> Any:
    """A detached KV cache ``[H, kv_heads, P, d]`` whose row ``i`` holds student row ``items[i].row``'s
    first ``starts[i]`` positions (the rest is padding, masked out by the attention mask)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    rows = torch.tensor([it.row for it in items])
    for layer_idx, layer in enumerate(student_cache.layers):
        k, v = layer.keys.detach(), layer.values.detach()
        if k.shape[2] < P:
            raise CadenzaError(
                "the student KV cache is shorter than a hinted prefix; pass the cache of the same batch"
            )
        k, v = k[rows.to(k.device), :, :P].clone(), v[rows.to(v.device), :, :P].clone()
        for i, s in enumerate(starts):
            k[i, :, s:] = 0
            v[i, :, s:] = 0
        cache.update(k, v, layer_idx)
    return cache
