"""One optimizer update from a step's episodes: ``L = L_grpo + lambda_sd * L_sd``, microbatched.

Token means run over the whole step, not per microbatch; zero-variance groups leave the GRPO term
(their hinted turns still feed the SD loss); every teacher input is built and validated before any
forward pass; an update with no signal (zero gradient) is skipped, because Adam would otherwise keep
moving the weights along its stale momentum.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from cadenza.optim.clip import clip_grad_norm_
from cadenza.rl.learn import turn_credit
from cadenza.rl.learn.logprobs import sequence_logprobs
from cadenza.rl.learn.losses import group_advantages
from cadenza.rl.learn.step import hinted_mask, rl_losses
from cadenza.rl.learn.teacher import Teacher, build_hinted_turns
from cadenza.rl.rollout.episodes import TrainEpisode, signal_rows
from cadenza.rl.text.tokens import collate
from cadenza.rl.train.ranks.data_parallel import DataParallel

if TYPE_CHECKING:
    from cadenza.rl.config import TrainConfig


@dataclass(kw_only=True)
class UpdateResult:
    grpo_loss: float = 0.0
    sd_loss: float = 0.0
    sd_tokens: int = 0
    entropy_unhinted: float = float("nan")
    clip_fraction: float = 0.0
    mismatch_kl: float = 0.0  # k3 KL(engine || trainer) on all model tokens
    is_truncated: float = 0.0  # fraction of model tokens whose importance weight hit the cap
    grad_norm: float = 0.0
    skipped: bool = True
    zero_variance_groups: int = 0
    hinted: set[tuple[int, int]] = field(default_factory=set)  # (episode, turn) pairs that got SD


@dataclass(kw_only=True)
class Learner:
    """The trainer's weights and how to update them (policy, optimizer, teacher, KL reference)."""

    cfg: TrainConfig
    policy: Any  # HFPolicy
    tokenizer: Any
    optimizer: torch.optim.Optimizer
    teacher: Teacher
    off_policy: bool = False
    """The engine's weights can differ from the trainer's: ``loss.is_cap`` then applies
    (:func:`cadenza.rl.train.build.is_off_policy`)."""
    ref_model: torch.nn.Module | None = None
    dp: DataParallel = field(default_factory=DataParallel)
    """The data-parallel group: this rank computes microbatches ``dp.mine(n)``; gradients are summed."""
    loss_fn: Callable[..., Any] = rl_losses
    """The per-microbatch losses (:func:`cadenza.rl.learn.step.rl_losses` or a user's, same signature)."""

    def update(self, episodes: list[TrainEpisode], step: int | None = None) -> UpdateResult:
        cfg, lc = self.cfg, self.cfg.loss
        tokens = [e.rollout.tokens for e in episodes]
        adv = group_advantages(
            [t.reward for t in tokens], [t.group_id for t in tokens], normalize_std=lc.std_normalize
        )
        grpo_rows, zero_var = signal_rows(tokens, lc.drop_zero_variance)
        if lc.turn_penalty > 0:  # turn-level credit without words (cadenza.rl.learn.turn_credit)
            grpo_rows |= turn_credit.penalised_rows(episodes)
        mb = cfg.optim.microbatch
        chunks = [list(range(lo, min(lo + mb, len(episodes)))) for lo in range(0, len(episodes), mb)]
        items = [
            build_hinted_turns(
                [tokens[i] for i in idx],
                [episodes[i].hints for i in idx],
                self.tokenizer,
                cfg.feedback.placement,
            )
            if lc.lambda_sd > 0
            else []
            for idx in chunks
        ]
        n_tok = sum(tokens[i].num_model_tokens for i in grpo_rows)
        n_seq = sum(1 for i in grpo_rows if tokens[i].num_model_tokens)
        n_sd = sum(it.num_tokens for chunk in items for it in chunk)
        n_all = sum(t.num_model_tokens for t in tokens)
        out = UpdateResult(sd_tokens=n_sd, zero_variance_groups=zero_var)
        out.hinted = {
            (idx[it.row], it.turn) for idx, chunk in zip(chunks, items, strict=True) for it in chunk
        }
        model = self.policy.model
        model.train()
        self.optimizer.zero_grad(set_to_none=True)
        ent_sum = ent_n = 0.0
        for k, ghost in self.dp.schedule(len(chunks)):  # a ghost keeps sharded ranks in lockstep
            idx, chunk = chunks[k], items[k]
            batch = collate([tokens[i] for i in idx], self.tokenizer.pad_token_id, device=self.policy.device)
            ref_lp = self.ref_logprobs(batch) if self.ref_model is not None else None
            chunk_adv = (
                turn_credit.token_advantages(adv, episodes, idx, batch.loss_mask.shape, lc.turn_penalty)
                if lc.turn_penalty > 0
                else adv[idx]
            )
            res = self.loss_fn(
                self.policy,
                batch,
                chunk_adv,
                items=chunk,
                teacher=self.teacher,
                loss=lc,
                temperature=cfg.rollout.temperature,
                chunk_size=cfg.teacher.chunk_size,
                off_policy=self.off_policy,
                ref_logprobs=ref_lp,
            )
            kept = sum(tokens[i].num_model_tokens for i in idx if i in grpo_rows)
            # a microbatch's GRPO term is a mean over its tokens (token_mean) or its sequences
            # (sequence_mean): weighted by its share of the step's, the sum is the whole-step mean;
            # a ghost microbatch (a rank with nothing left, stepping in lockstep) weighs nothing
            if not kept or ghost:  # no row of this microbatch carries a GRPO signal
                w_grpo = 0.0
            elif lc.aggregation == "sequence_mean":
                w_grpo = sum(1 for i in idx if tokens[i].num_model_tokens) / n_seq
            else:
                w_grpo = res.num_model_tokens / n_tok
            w_sd = res.sd.num_tokens / n_sd if n_sd and not ghost else 0.0
            loss = res.grpo * w_grpo + lc.lambda_sd * res.sd.loss * w_sd
            if self.dp.lockstep and lc.lambda_sd > 0 and not chunk:
                self._teacher_in_lockstep(items, k)
            (loss * self.dp.loss_scale).backward()
            if ghost:
                continue
            out.grpo_loss += float(res.grpo.detach()) * w_grpo
            out.sd_loss += float(res.sd.loss.detach()) * w_sd
            n_unhinted = float((batch.loss_mask * (1 - hinted_mask(batch, chunk))).sum())
            ent_sum += res.entropy_unhinted * n_unhinted
            ent_n += n_unhinted
            w_all = res.num_model_tokens / n_all if n_all else 0.0
            out.clip_fraction += res.clip_fraction * w_all
            out.mismatch_kl += res.mismatch_kl * w_all
            out.is_truncated += res.is_truncated * w_all
        self.dp.sum_grads(model.parameters())
        # the ranks' partial metric sums, summed (a single process keeps its own values untouched)
        summed = ("grpo_loss", "sd_loss", "clip_fraction", "mismatch_kl", "is_truncated")
        *totals, ent_sum, ent_n = self.dp.sum_floats([*(getattr(out, n) for n in summed), ent_sum, ent_n])
        for name, value in zip(summed, totals, strict=True):
            setattr(out, name, value)
        out.entropy_unhinted = ent_sum / ent_n if ent_n else float("nan")
        out.grad_norm = float(clip_grad_norm_(model.parameters(), cfg.optim.grad_clip or float("inf")))
        out.skipped = out.grad_norm == 0.0
        if not out.skipped:
            self.optimizer.step()
            self.teacher.update(model, step=step)  # a snapshot teacher refreshes on the trainer's steps
        self.optimizer.zero_grad(set_to_none=True)
        return out

    def _teacher_in_lockstep(self, items: list[list[Any]], k: int) -> None:
        """Another rank of this round runs the teacher: run it too (on one of its items), unused."""
        lo = k - k % self.dp.per_round
        other = next((c for c in items[lo : lo + self.dp.per_round] if c), None)
        if other is not None:
            self.teacher.target_hidden(other[:1])

    @torch.no_grad()
    def ref_logprobs(self, batch: Any) -> torch.Tensor:
        assert self.ref_model is not None
        hidden = self.ref_model.get_decoder()(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask
        ).last_hidden_state
        lp, _ = sequence_logprobs(
            hidden,
            self.ref_model.get_output_embeddings(),
            batch.input_ids,
            batch.loss_mask,
            chunk_size=self.cfg.teacher.chunk_size,
            temperature=self.cfg.rollout.temperature,
            context=getattr(self.policy, "context", None),  # the reference's decoder splits like the policy's
        )
        return lp

    @torch.no_grad()
    def update_kl(self, tokens: list[Any], hinted: set[tuple[int, int]]) -> float:
        """KL(before || after) of this step's update on un-hinted turns: k3 on the tokens sampled before
        it."""
        total = count = 0.0
        mb = self.cfg.optim.microbatch
        starts = list(range(0, len(tokens), mb))
        for k, ghost in self.dp.schedule(len(starts)):
            idx = list(range(starts[k], min(starts[k] + mb, len(tokens))))
            batch = collate([tokens[i] for i in idx], self.tokenizer.pad_token_id, device=self.policy.device)
            hidden, _ = self.policy.hidden_states(batch.input_ids, batch.attention_mask)
            lp, _ = sequence_logprobs(
                hidden,
                self.policy.lm_head,
                batch.input_ids,
                batch.loss_mask,
                chunk_size=self.cfg.teacher.chunk_size,
                temperature=self.cfg.rollout.temperature,
                context=getattr(self.policy, "context", None),
            )
            mask = batch.loss_mask.clone()
            for row, i in enumerate(idx):
                for k, (s, e) in enumerate(tokens[i].turn_spans):
                    if (i, k) in hinted:
                        mask[row, s:e] = 0
            if ghost:
                continue
            log_ratio = lp - batch.behaviour_logprobs
            total += float(((torch.exp(log_ratio) - log_ratio - 1) * mask).sum())
            count += float(mask.sum())
        total, count = self.dp.sum_floats([total, count])
        return total / count if count else float("nan")
