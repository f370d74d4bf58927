"""The RL trainer: rollouts -> grade -> monitor -> feedback -> ``L = L_grpo + lambda_sd * L_sd`` -> step.

One step:
1. sample ``tasks_per_step`` tasks from the env source and roll out ``group_size`` episodes each
   (batched generation, exact sampled ids and behaviour log-probs);
2. the env's ``finish()`` grades each episode; the reward-hacking monitor (if installed) zeroes the
   reward of flagged episodes;
3. feedback generators turn each trajectory into hints aimed at specific turns;
4. the loss: the GRPO clipped surrogate over all model tokens with group-normalised advantages, plus
   ``lambda_sd`` times the self-distillation divergence between the policy under the original context
   (student) and the teacher under the hinted context, on the hinted turns' tokens only (per-turn
   gating: turns without a hint get no SD gradient);
5. AdamW step with global grad-norm clipping; EMA teacher update when configured;
6. metrics to ``metrics.jsonl`` (and TensorBoard if installed); checkpoints for exact resume.

Randomness is a pure function of (seed, step): tasks and sampling of step ``s`` use generators seeded
from ``(run.seed, s)``, so a resumed run replays exactly what an uninterrupted run would have done.
"""

from __future__ import annotations

import copy
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from cadenza.agent.trajectory import Trajectory
from cadenza.errors import CadenzaError
from cadenza.feedback.generate import generate_hints
from cadenza.feedback.hints import Hint
from cadenza.jsonio import atomic_write_json
from cadenza.metrics import MetricsLogger, read_metrics
from cadenza.optim.clip import clip_grad_norm_
from cadenza.rl import checkpoint as ckpt
from cadenza.rl.config import TrainConfig, validate
from cadenza.rl.curriculum import PoolExhausted, drop_zero_variance
from cadenza.rl.envs import load_source
from cadenza.rl.logprobs import sequence_logprobs
from cadenza.rl.losses import group_advantages
from cadenza.rl.monitor_hook import apply_monitor, find_monitor
from cadenza.rl.rollout import Rollout, RolloutTask, rollout
from cadenza.rl.rollout import RolloutConfig as RolloutParams
from cadenza.rl.step import LossConfig as StepLossConfig
from cadenza.rl.step import hinted_mask, rl_losses
from cadenza.rl.teacher import SelfDistillConfig, Teacher, build_hinted_turns
from cadenza.rl.tokens import collate


def build_policy(cfg: TrainConfig) -> tuple[Any, Any]:
    """Tokenizer + :class:`HFPolicy` from ``[model]``: a local HF directory, or random init."""
    from cadenza.rl.chat import load_tokenizer
    from cadenza.rl.policy import HFPolicy, tiny_qwen3_config, tiny_qwen3_moe_config

    m = cfg.model
    tokenizer = load_tokenizer(m.tokenizer or m.path)
    if m.path:
        policy = HFPolicy.from_pretrained(m.path, dtype=m.dtype, device=m.device)
    else:
        common = dict(
            hidden_size=m.hidden_size,
            num_hidden_layers=m.num_layers,
            num_attention_heads=m.num_heads,
            num_key_value_heads=m.num_kv_heads,
            head_dim=m.hidden_size // m.num_heads,
        )
        if m.arch == "qwen3_moe":
            conf = tiny_qwen3_moe_config(
                len(tokenizer),
                moe_intermediate_size=m.intermediate_size,
                num_experts=m.num_experts,
                num_experts_per_tok=m.experts_per_token,
                **common,
            )
        else:
            conf = tiny_qwen3_config(len(tokenizer), intermediate_size=m.intermediate_size, **common)
        policy = HFPolicy.from_config(conf, seed=cfg.run.seed, dtype=m.dtype, device=m.device)
    if policy.vocab_size < len(tokenizer):
        raise CadenzaError(
            f"model vocab ({policy.vocab_size}) is smaller than the tokenizer's ({len(tokenizer)}); they do not belong together"
        )
    return tokenizer, policy


# run options that may change between a run and its resumption
_RESUMABLE_CHANGES = {
    "steps",
    "progress",
    "tensorboard",
    "checkpoint_every",
    "keep_checkpoints",
    "out_dir",
    "threads",
    "measure_kl",
}


def _check_same_run(path: Path, cfg: TrainConfig) -> None:
    """Refuse to resume a checkpoint written under a different config (it would silently mix two runs)."""
    if not path.exists():
        return
    import json

    old, new = json.loads(path.read_text()), cfg.to_dict()
    diffs = [
        f"{sec}.{k}"
        for sec in new
        for k in new[sec]
        if old.get(sec, {}).get(k) != new[sec][k] and not (sec == "run" and k in _RESUMABLE_CHANGES)
    ]
    if diffs:
        raise CadenzaError(
            f"{path.parent} holds a run with a different config ({', '.join(diffs[:5])}); "
            "use another run.out_dir, or --no-resume to start over"
        )


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """``[optim]`` through the shared builder: AdamW, or Muon (``muon_lr``) with AdamW (``lr``) for the rest."""
    from cadenza.optim.build import MuonConfig
    from cadenza.optim.build import build_optimizer as build

    o = cfg.optim
    if o.name == "muon":  # Muon's AdamW groups keep the builder's betas (0.9, 0.95), as they always had
        muon = MuonConfig(adjust_lr="original", adamw_lr=o.lr)
        return build("muon", model, lr=o.muon_lr, weight_decay=o.weight_decay, muon=muon, decay_vectors=True)
    return build(
        "adamw", model, lr=o.lr, weight_decay=o.weight_decay, betas=tuple(o.betas), decay_vectors=True
    )


class _HiddenToolsEnv:
    """View of an env whose tool list must not be rendered into the prompt (``env.show_tools = False``,
    e.g. toolworld); the real schemas stay available to the feedback generators."""

    def __init__(self, env: Any):
        self.env = env

    def reset(self) -> list[dict[str, Any]]:
        return self.env.reset()

    def tools(self) -> list[dict[str, Any]]:
        return []

    def step(self, call: Any) -> Any:
        return self.env.step(call)

    def finish(self) -> dict[str, Any]:
        return self.env.finish()


@dataclass(kw_only=True)
class Episode:
    """One rollout with what the trainer derived from it."""

    rollout: Rollout
    tools: list[dict[str, Any]]  # real tool schemas (for feedback)
    render_tools: list[dict[str, Any]]  # what the prompt showed (for teacher inputs)
    hints: list[Hint] = field(default_factory=list)
    flags: int = 0

    @property
    def trajectory(self) -> Trajectory:
        return self.rollout.trajectory


class Trainer:
    def __init__(self, cfg: TrainConfig, *, resume: bool = True):
        validate(cfg)
        self.cfg = cfg
        self.out = Path(cfg.run.out_dir)
        latest = ckpt.latest_checkpoint(self.out) if resume else None
        if latest is not None:
            _check_same_run(self.out / "config.json", cfg)
        self.source = load_source(cfg.env.name, cfg.env.options)
        if hasattr(
            self.source, "run_id"
        ):  # pool records of this run stay apart from other runs' (same on resume)
            import hashlib

            self.source.run_id = hashlib.sha1(str(self.out.resolve()).encode()).hexdigest()[:12]
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        torch.manual_seed(cfg.run.seed)
        random.seed(cfg.run.seed)
        self.tokenizer, self.policy = build_policy(cfg)
        self.model = self.policy.model
        self.optimizer = build_optimizer(self.model, cfg)
        lc, tc = cfg.loss, cfg.teacher
        self.sd_config = SelfDistillConfig(
            placement=cfg.feedback.placement,
            teacher=tc.weights,
            ema_decay=tc.ema_decay,
            reuse_prefix_cache=tc.reuse_prefix_cache,
            divergence=lc.divergence,
            beta=lc.beta,
            top_k=lc.top_k or None,
            temperature=lc.sd_temperature,
            chunk_size=tc.chunk_size,
            token_clip=lc.token_clip or None,
        )
        self.step_config = StepLossConfig(
            clip_eps_low=lc.clip_eps,
            clip_eps_high=lc.clip_eps_high,
            kl_coef=lc.kl_ref,
            aggregation=lc.aggregation,
            lambda_sd=lc.lambda_sd,
            temperature=cfg.rollout.temperature,
            chunk_size=tc.chunk_size,
        )
        self.teacher = Teacher(self.model, self.sd_config)
        self.ref_model = self._frozen_copy() if lc.kl_ref > 0 else None
        self.monitor = find_monitor() if cfg.run.monitor == "auto" else None
        self.step = 0
        self.episodes = 0
        self.out.mkdir(parents=True, exist_ok=True)
        if latest is not None:
            self.step, state = ckpt.load_checkpoint(
                latest, self.model, self.optimizer, modules=self._extra_modules()
            )
            self.episodes = int(state.get("episodes", 0))
        atomic_write_json(self.out / "config.json", cfg.to_dict())
        self.logger = MetricsLogger(self.out, resume_step=self.step, tensorboard=cfg.run.tensorboard)

    def _frozen_copy(self) -> torch.nn.Module:
        """A gradient-free copy of the current weights (the KL reference)."""
        m = copy.deepcopy(self.model)
        m.requires_grad_(False)
        return m

    # ------------------------------------------------------------------ loop

    def train(self) -> list[dict[str, Any]]:
        """Run until ``run.steps``; return all metric rows of this run directory."""
        cfg = self.cfg
        progress = None
        if cfg.run.progress:
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            progress = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TextColumn("{task.fields[info]}"),
                TimeRemainingColumn(),
                transient=False,
            )
            bar = progress.add_task("train", total=cfg.run.steps, completed=self.step, info="")
            progress.start()
        try:
            while self.step < cfg.run.steps:
                self.step += 1
                try:
                    row = self.train_step(self.step)
                except PoolExhausted as exc:
                    self.step -= 1
                    if self.step:
                        self.save()
                    raise PoolExhausted(f"training stopped after step {self.step}: {exc}") from None
                self.logger.log(self.step, row)
                every = cfg.run.checkpoint_every
                if (every and self.step % every == 0) or self.step == cfg.run.steps:
                    self.save()
                if progress is not None:
                    progress.update(
                        bar,
                        advance=1,
                        info=f"reward {row['reward']:.2f} invalid {row['invalid_tool_rate']:.2f} sd {row['sd_loss']:.3f}",
                    )
        finally:
            if progress is not None:
                progress.stop()
            self.logger.close()
        return read_metrics(self.logger.path)

    def _extra_modules(self) -> dict[str, torch.nn.Module]:
        """Weights besides the policy that an exact resume needs: an EMA or frozen teacher, the KL reference."""
        modules = {"teacher": self.teacher.model} if self.cfg.teacher.weights != "live" else {}
        if self.ref_model is not None:
            modules["reference"] = self.ref_model
        return modules

    def save(self) -> Path:
        return ckpt.save_checkpoint(
            self.out,
            self.step,
            self.model,
            self.optimizer,
            trainer_state={"episodes": self.episodes},
            modules=self._extra_modules(),
            keep=self.cfg.run.keep_checkpoints,
        )

    def collect(self, step: int) -> list[Episode]:
        """Rollouts for one step, graded, monitored and annotated with hints."""
        cfg = self.cfg
        base = cfg.run.seed * 1_000_003 + step
        tasks = self.source.sample_tasks(
            random.Random(base), cfg.rollout.tasks_per_step, (step - 1) * cfg.rollout.tasks_per_step
        )
        made: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = []

        def factory(task: Any):
            def make() -> Any:
                env = self.source.make_env(task)
                real = list(env.tools())
                shown = real if getattr(env, "show_tools", True) else []
                made.append((real, shown))
                return env if shown is real else _HiddenToolsEnv(env)

            return make

        r = cfg.rollout
        params = RolloutParams(
            group_size=r.group_size,
            max_turns=r.max_turns,
            max_new_tokens=r.max_new_tokens,
            temperature=r.temperature,
            top_k=r.top_k,
            seed=base,
        )
        results = rollout(
            self.policy,
            self.tokenizer,
            [RolloutTask(task_id=str(getattr(t, "id", i)), make_env=factory(t)) for i, t in enumerate(tasks)],
            params,
        )
        episodes = []
        count = self._token_count
        for res, (real, shown) in zip(results, made, strict=True):
            ep = Episode(rollout=res, tools=real, render_tools=shown)
            reward, ep.flags = apply_monitor(self.monitor, res.trajectory, res.tokens.reward)
            res.tokens.reward = reward
            res.trajectory.reward = reward
            if cfg.loss.lambda_sd > 0 and cfg.feedback.kinds:
                errors: list[str] = []
                ep.hints = generate_hints(res.trajectory, real, cfg.feedback, length=count, errors=errors)
                for h in ep.hints:
                    res.trajectory.turns[h.turn].hints.append(h.to_dict())
            episodes.append(ep)
        return episodes

    def _token_count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def train_step(self, step: int) -> dict[str, Any]:
        cfg, lc = self.cfg, self.cfg.loss
        t0 = time.perf_counter()
        collected = self.collect(step)
        pool_row = self._record_pool(step, collected)
        episodes = [e for e in collected if e.rollout.tokens.turn_spans]
        t_roll = time.perf_counter() - t0
        if not episodes:
            raise CadenzaError("no rollout produced a model turn; check rollout.max_new_tokens and the env")
        tokens = [e.rollout.tokens for e in episodes]
        rewards = [t.reward for t in tokens]
        adv = group_advantages(rewards, [t.group_id for t in tokens], normalize_std=lc.std_normalize)
        grpo_rows, zero_var = self._signal_rows(tokens)
        mb = cfg.optim.microbatch
        chunks = [list(range(lo, min(lo + mb, len(episodes)))) for lo in range(0, len(episodes), mb)]
        # every teacher input is built (and validated) before any forward pass
        use_sd = lc.lambda_sd > 0
        items = [
            build_hinted_turns(
                [tokens[i] for i in idx],
                [episodes[i].hints for i in idx],
                self.tokenizer,
                cfg.feedback.placement,
            )
            if use_sd
            else []
            for idx in chunks
        ]
        n_tok = sum(tokens[i].num_model_tokens for i in grpo_rows)
        n_sd = sum(it.num_tokens for chunk in items for it in chunk)
        hinted = {(idx[it.row], it.turn) for idx, chunk in zip(chunks, items, strict=True) for it in chunk}
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        grpo_total = sd_total = ent_sum = ent_n = clip_sum = 0.0
        for idx, chunk in zip(chunks, items, strict=True):
            batch = collate([tokens[i] for i in idx], self.tokenizer.pad_token_id, device=self.policy.device)
            ref_lp = self._ref_logprobs(batch) if self.ref_model is not None else None
            res = rl_losses(
                self.policy,
                batch,
                adv[idx],
                items=chunk,
                teacher=self.teacher,
                config=self.step_config,
                ref_logprobs=ref_lp,
            )
            # token means over the whole step, not per microbatch
            # Zero-variance groups leave the GRPO term: their advantages are exactly 0, and the token mean
            # runs over the kept groups' tokens only (their hinted turns still feed the SD loss).
            kept = sum(tokens[i].num_model_tokens for i in idx if i in grpo_rows)
            w_grpo = res.num_model_tokens / n_tok if kept else 0.0
            w_sd = res.sd.num_tokens / n_sd if n_sd else 0.0
            loss = res.grpo * w_grpo + lc.lambda_sd * res.sd.loss * w_sd
            loss.backward()
            grpo_total += float(res.grpo.detach()) * w_grpo
            sd_total += float(res.sd.loss.detach()) * w_sd
            n_unhinted = float((batch.loss_mask * (1 - hinted_mask(batch, chunk))).sum())
            ent_sum += res.entropy_unhinted * n_unhinted
            ent_n += n_unhinted
            clip_sum += res.clip_fraction * w_grpo
        grad_norm = float(clip_grad_norm_(self.model.parameters(), cfg.optim.grad_clip or float("inf")))
        # No signal (every group tied, no hinted token): skip the update. Adam would otherwise keep moving
        # the weights along its stale momentum with a zero gradient.
        skipped = grad_norm == 0.0
        if not skipped:
            self.optimizer.step()
            self.teacher.update(self.model)
        self.optimizer.zero_grad(set_to_none=True)
        kl = self._update_kl(tokens, hinted) if cfg.run.measure_kl and not skipped else 0.0
        self.episodes += len(episodes)
        turns = [t for e in episodes for t in e.trajectory.turns]
        n_turns = max(1, len(turns))
        elapsed = time.perf_counter() - t0
        return {
            "episodes": self.episodes,
            "reward": sum(rewards) / len(rewards),
            "resolved_rate": sum(bool(e.rollout.outcome.get("resolved")) for e in episodes) / len(episodes),
            "invalid_tool_rate": sum(t.error_kind == "tool_not_found" for t in turns) / n_turns,
            "valid_call_rate": sum(t.tool is not None and t.error_kind != "tool_not_found" for t in turns)
            / n_turns,
            "tool_error_rate": sum(t.error_kind is not None for t in turns) / n_turns,
            "turns_per_episode": len(turns) / len(episodes),
            "hinted_turns": len(hinted),
            "hint_rate": len(hinted) / n_turns,
            "flagged": sum(e.flags > 0 for e in episodes),
            "grpo_loss": grpo_total,
            "sd_loss": sd_total,
            "sd_tokens": n_sd,
            "kl_unhinted": kl,
            "entropy_unhinted": ent_sum / ent_n if ent_n else float("nan"),
            "clip_fraction": clip_sum,
            "grad_norm": grad_norm,
            "skipped_update": skipped,
            "model_tokens": sum(t.num_model_tokens for t in tokens),
            "zero_variance_groups": zero_var,
            **pool_row,
            "tokens_per_s": sum(len(t) for t in tokens) / max(elapsed, 1e-9),
            "rollout_s": t_roll,
            "step_s": elapsed,
        }

    def _signal_rows(self, tokens: list[Any]) -> tuple[set[int], int]:
        """Rows whose group's rewards vary (all rows when ``loss.drop_zero_variance`` is off) and the dropped group count."""
        groups: dict[str, list[int]] = {}
        for i, t in enumerate(tokens):
            groups.setdefault(t.group_id, []).append(i)
        rows = list(groups.values())
        keep, dropped = drop_zero_variance([[tokens[i].reward for i in r] for r in rows])
        if not self.cfg.loss.drop_zero_variance:
            return set(range(len(tokens))), dropped
        return {i for k in keep for i in rows[k]}, dropped

    def _record_pool(self, step: int, episodes: list[Episode]) -> dict[str, Any]:
        """Hand every rollout's outcome to a source that keeps a task pool (``record``); its metrics join the step's."""
        record = getattr(self.source, "record", None)
        if not callable(record):
            return {}
        from cadenza.rl.taskset import GroupOutcome

        outcomes = [
            GroupOutcome(
                task_id=e.rollout.tokens.group_id.split(":", 1)[1],
                reward=float(e.rollout.tokens.reward),
                resolved=bool(e.rollout.outcome.get("resolved")),
                flagged=e.flags > 0 or bool(e.trajectory.flags),
            )
            for e in episodes
        ]
        return dict(record(step, outcomes) or {})

    @torch.no_grad()
    def _ref_logprobs(self, batch: Any) -> torch.Tensor:
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
        )
        return lp

    @torch.no_grad()
    def _update_kl(self, tokens: list[Any], hinted: set[tuple[int, int]]) -> float:
        """KL(before || after) of this step's update on un-hinted turns: k3 on the tokens sampled before it."""
        total = count = 0.0
        mb = self.cfg.optim.microbatch
        for lo in range(0, len(tokens), mb):
            idx = list(range(lo, min(lo + mb, len(tokens))))
            batch = collate([tokens[i] for i in idx], self.tokenizer.pad_token_id, device=self.policy.device)
            hidden, _ = self.policy.hidden_states(batch.input_ids, batch.attention_mask)
            lp, _ = sequence_logprobs(
                hidden,
                self.policy.lm_head,
                batch.input_ids,
                batch.loss_mask,
                chunk_size=self.cfg.teacher.chunk_size,
                temperature=self.cfg.rollout.temperature,
            )
            mask = batch.loss_mask.clone()
            for row, i in enumerate(idx):
                for k, (s, e) in enumerate(tokens[i].turn_spans):
                    if (i, k) in hinted:
                        mask[row, s:e] = 0
            log_ratio = lp - batch.behaviour_logprobs
            total += float(((torch.exp(log_ratio) - log_ratio - 1) * mask).sum())
            count += float(mask.sum())
        return total / count if count else float("nan")
