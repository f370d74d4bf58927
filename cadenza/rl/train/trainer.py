"""The RL trainer: rollouts -> grade -> monitor -> feedback -> ``L = L_grpo + lambda_sd * L_sd`` -> step.

One step (:meth:`Trainer.train_step`):
1. take the step's episodes from the rollout pipeline: ``tasks_per_step`` tasks x ``group_size``
   episodes sampled by the engine (exact ids and behaviour log-probs, the policy version per turn),
   graded by the env's ``finish()``, reward zeroed by the reward-hacking monitor on flagged episodes,
   annotated with feedback hints aimed at specific turns;
2. drop the episodes sampled by weights more than ``rollout.max_staleness`` versions old (counted);
3. one update (:mod:`cadenza.rl.train.update`): GRPO over all model tokens with group-normalised advantages
   (truncated importance sampling against the engine's log-probs when they can come from other
   weights), plus ``lambda_sd`` times the per-turn self-distillation divergence on hinted turns;
4. sync the engine to the new weights (version = step), record the outcomes in the task pool, queue
   the rollouts of step ``step + max_staleness + 1``;
5. metrics to ``metrics.jsonl`` (and TensorBoard if installed); checkpoints for exact resume.

With ``max_staleness = K > 0`` the rollouts of steps n+1..n+K run on a background thread while step n
trains (:mod:`cadenza.rl.rollout.pipeline`); step s is always sampled by version ``max(0, s - 1 - K)``, and
checkpoints keep the finished rollouts queued ahead, so a resumed run replays exactly. Randomness is a
pure function of (seed, step): tasks and sampling of step ``s`` use generators seeded from
``(run.seed, s)``.
"""

from __future__ import annotations

import copy
import hashlib
import random
import time
from pathlib import Path
from typing import Any

import torch

from cadenza.errors import CadenzaError
from cadenza.jsonio import atomic_write_json
from cadenza.metrics import MetricsLogger, read_metrics
from cadenza.rl.config import TrainConfig, ensure_valid
from cadenza.rl.engines.gpu_sync import ModuleWeights
from cadenza.rl.engines.sync_check import ParityProbe
from cadenza.rl.learn.probe import HintFollowingEroded, ProbeSchedule, schedule_for_run
from cadenza.rl.learn.teacher import Teacher
from cadenza.rl.rollout.curriculum import PoolExhausted
from cadenza.rl.rollout.episodes import (
    TrainEpisode,
    collect_episodes,
    record_pool,
    sample_step_tasks,
)
from cadenza.rl.rollout.longtail import CutCounts, step_groups
from cadenza.rl.rollout.pipeline import RolloutPipeline, WatchedEngine
from cadenza.rl.train import checkpoint as ckpt
from cadenza.rl.train import heldout
from cadenza.rl.train.build import build_optimizer, build_policy, check_same_run, is_off_policy
from cadenza.rl.train.components import Components
from cadenza.rl.train.local_engine import build_engine
from cadenza.rl.train.progress import progress_bar
from cadenza.rl.train.ranks import sharding, stream_sync
from cadenza.rl.train.ranks.data_parallel import DataParallel
from cadenza.rl.train.ray_workers import RayWorkers
from cadenza.rl.train.step_metrics import metrics_row
from cadenza.rl.train.update import Learner, UpdateResult
from cadenza.rl.train.workers import Unit

__all__ = ["Components", "TrainEpisode", "Trainer", "build_optimizer", "build_policy"]


class Trainer:
    """One rank of the trainer (under torchrun, rank 0 also collects rollouts: :mod:`.data_parallel`)."""

    def __init__(
        self,
        cfg: TrainConfig,
        *,
        resume: bool = True,
        dp: DataParallel | None = None,
        components: Components | None = None,
    ):
        ensure_valid(cfg)  # once: load_config has already checked a config read from TOML
        self.cfg = cfg
        self.components = parts = components or Components()
        self.dp = dp or DataParallel.join(timeout_s=cfg.run.collective_timeout_s)
        self.out = Path(cfg.run.out_dir)
        latest = ckpt.latest_checkpoint(self.out) if resume else None
        if latest is not None:
            check_same_run(self.out / "config.json", cfg)
        # the task source, its pool and every rollout belong to rank 0 alone
        self.source = parts.build_source(cfg) if self.dp.main else None
        self.heldout = heldout.HeldOut(cfg, self.source) if cfg.eval.every and self.dp.main else None
        if hasattr(
            self.source, "run_id"
        ):  # pool records of this run stay apart from other runs' (and resume)
            self.source.run_id = hashlib.sha1(str(self.out.resolve()).encode()).hexdigest()[:12]
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        torch.manual_seed(cfg.run.seed)
        random.seed(cfg.run.seed)
        self.tokenizer, self.policy = build_policy(cfg)
        self.model = self.policy.model
        self.teacher = Teacher(self.model, cfg.teacher, cfg.loss)
        self.ref_model = self._frozen_copy() if cfg.loss.kl_ref > 0 else None
        self.rollout_policy = self.policy  # what engines sample from and sync with
        # under torchrun: the policy, teacher and reference wrapped in place on the dual mesh ([parallel])
        self.shards = sharding.shard_trainer(self) if self.dp.world > 1 or self.dp.force_sharding else None
        self._streams = self.shards is not None and not stream_sync.needs_rollout_copy(cfg)
        self._engine_version: int | None = None  # streams: the version the engine was started at
        self.optimizer = (parts.optimizer or build_optimizer)(self.model, cfg)
        self.learner = Learner(cfg=cfg, policy=self.policy, tokenizer=self.tokenizer,
                               optimizer=self.optimizer, teacher=self.teacher, off_policy=is_off_policy(cfg),
                               ref_model=self.ref_model, dp=self.dp, loss_fn=parts.loss_fn)  # fmt: skip
        self.step = 0
        self.episodes = 0
        self.dropped_stale = 0
        # rollouts queued ahead when the checkpoint was written
        self._restored: dict[int, list[TrainEpisode]] = {}
        self._engine: WatchedEngine | None = None
        self._parity: ParityProbe | None = None
        self.pipeline: RolloutPipeline | None = None
        self.out.mkdir(parents=True, exist_ok=True)
        if latest is not None:
            load = self.shards.load_checkpoint if self.shards else ckpt.load_checkpoint
            self.step, state = load(latest, self.model, self.optimizer, modules=self._extra_modules())
            self.episodes = int(state.get("episodes", 0))
            self.dropped_stale = int(state.get("dropped_stale", 0))
            self._restored = dict(state.get("pending", {}))
        self.dp.check_replicas(self.model)
        self.logger: Any = None  # a MetricsLogger (with the components' sink, if any)
        self.probe = ProbeSchedule(None, every=0)
        if self.dp.main:
            atomic_write_json(self.out / "config.json", cfg.to_dict())
            self.logger = parts.with_sink(MetricsLogger(
                self.out, resume_step=self.step, tensorboard=cfg.run.tensorboard, wandb=cfg.run.wandb,
                wandb_project=cfg.run.wandb_project, run_config=cfg.to_dict(),
            ))  # fmt: skip
            self.probe = schedule_for_run(cfg, self.source, self.tokenizer, read_metrics(self.logger.path))
        self._collected: list[TrainEpisode] = []  # rank 0: the step's rollouts, stale ones included
        self._cuts: dict[int, CutCounts] = {}  # rank 0: what long-tail control cut, per step

    def _frozen_copy(self) -> torch.nn.Module:
        """A gradient-free copy of the current weights (the KL reference)."""
        m = copy.deepcopy(self.model)
        m.requires_grad_(False)
        return m

    # ------------------------------------------------------------------ engine and rollouts

    @property
    def engine(self) -> WatchedEngine:
        """The rollout engine (built on first use), holding the trainer's current weights."""
        return self._engine_at(self.step)

    def _engine_at(self, version: int, *, sync: bool = True) -> WatchedEngine:
        """Build the engine if needed; ``version`` counts the updates the trainer's weights have had.
        ``sync=False``: leave a behind engine for the caller (a sync from the shards is collective)."""
        if self._engine is None:
            make = self.components.engine or build_engine
            built = make(self.cfg, self.rollout_policy, self.tokenizer, version=version)
            engine = WatchedEngine(built)
            self._engine = engine
            if engine.version != version and sync:  # a served engine starts from the initial weights
                engine.sync_weights(self._weights(), version=version)
                self._check_parity(version)
        return self._engine

    def _parity_probe(self) -> ParityProbe | None:
        """The sync probe (``rollout.sync_probe_tol > 0``), built on first use."""
        if self.cfg.rollout.sync_probe_tol > 0 and self._parity is None:
            self._parity = ParityProbe(self.tokenizer, self.cfg.rollout.sync_probe_tol)
        return self._parity

    def _check_parity(self, version: int, *, want: torch.Tensor | None = None) -> None:
        """``rollout.sync_probe_tol``: the engine scores a probe like the trainer, or the run stops
        (``want``: the trainer's log-probs, computed by every rank when the policy is sharded)."""
        if self._parity_probe() is not None and self._engine is not None:
            model = None if want is not None else self.rollout_policy.model
            self._parity.check(self._engine.engine, model, version, want=want)

    def _weights(self) -> ModuleWeights:
        """The trainer's parameters as ``(engine name, full tensor)``, streamed one at a time (DTensor
        shards gathered per tensor), with the metadata vLLM's native NCCL / IPC transfer declares first."""
        return ModuleWeights(self.rollout_policy.model)

    def collect(self, step: int) -> list[TrainEpisode]:
        """Rollouts for one step, graded, monitored and annotated with hints (synchronously, now)."""
        tasks = sample_step_tasks(self.source, self.cfg, step)
        return self._collect(step, tasks)

    def _collect(self, step: int, tasks: list[Any]) -> list[TrainEpisode]:
        workers = self.engine.engine
        if isinstance(workers, RayWorkers):  # one unit per task, run by the actors
            units = [Unit(step=step, index=i, task=t) for i, t in enumerate(tasks)]
            return [e for eps in workers.run(units) if eps for e in eps]
        cut = self._cuts.setdefault(step, CutCounts())  # long-tail control's counts (read by train_step)
        return collect_episodes(self.engine, self.tokenizer, self.source, self.cfg, step, tasks, cut=cut)

    def _queue(self, step: int) -> None:
        """Queue step ``step``'s rollouts (tasks drawn now, on this thread: the pool is not thread-safe)."""
        assert self.pipeline is not None
        if step > self.cfg.run.steps:
            return
        if step in self._restored:
            self.pipeline.put(step, (self._restored.pop(step), 0.0))
            return
        try:
            tasks = sample_step_tasks(self.source, self.cfg, step)
        except PoolExhausted as exc:  # raised when the trainer reaches that step, as in the synchronous loop
            self.pipeline.put(step, error=exc)
            return

        def job() -> tuple[list[TrainEpisode], float]:
            t0 = time.perf_counter()
            return self._collect(step, tasks), time.perf_counter() - t0

        self.pipeline.submit(step, job)

    def _rollouts(self, step: int) -> tuple[list[TrainEpisode], float]:
        """Step ``step``'s episodes and the seconds spent generating them (starts the pipeline if needed)."""
        if self.pipeline is None:
            engine = self._engine_at(step - 1)  # step ``step`` starts from the weights of version step - 1
            self.pipeline = RolloutPipeline(engine, timeout_s=self.cfg.rollout.engine_timeout_s)
            for s in range(step, step + self.cfg.rollout.max_staleness + 1):
                self._queue(s)
        return self.pipeline.take(step)

    def _fresh(self, step: int, collected: list[TrainEpisode]) -> tuple[list[TrainEpisode], dict[str, Any]]:
        """Episodes with a model turn sampled by weights at most ``max_staleness`` versions behind the
        ones this update starts from (version ``step - 1``); the stale are dropped and counted."""
        kept, staleness, dropped = [], [], 0
        for e in collected:
            if not e.rollout.tokens.turn_spans:
                continue
            lag = step - 1 - e.policy_version
            if lag > self.cfg.rollout.max_staleness:
                dropped += 1
                continue
            kept.append(e)
            staleness.append(lag)
        self.dropped_stale += dropped
        counts = getattr(self._engine.engine, "counts", None) if self._engine is not None else None
        units = {} if counts is None else {"units_retried": counts.retried, "units_lost": counts.lost}
        return kept, {
            **units,
            "policy_version": step - 1,
            "staleness_mean": sum(staleness) / len(staleness) if staleness else 0.0,
            "staleness_max": max(staleness, default=0),
            "dropped_stale": dropped,
            "dropped_stale_total": self.dropped_stale,
        }

    def _sync_engine(self, step: int) -> float:
        """Push the updated weights into the engine as version ``step``; seconds taken."""
        assert self.pipeline is not None
        seconds = self.pipeline.sync(self._weights, version=step, partial=self.cfg.rollout.partial_rollouts)
        self._check_parity(step)
        return seconds

    def close(self) -> None:
        """Stop the rollout thread and the engine (idempotent)."""
        if self.pipeline is not None:
            self.pipeline.close()
            self.pipeline = None
        if self._engine is not None:
            self._engine.engine.close()
            self._engine = None

    # ------------------------------------------------------------------ loop

    def train(self) -> list[dict[str, Any]]:
        """Run until ``run.steps``; return all metric rows of this run directory."""
        cfg = self.cfg
        progress = progress_bar(cfg.run.steps, self.step) if cfg.run.progress and self.dp.main else None
        try:
            while self.step < cfg.run.steps:
                self.step += 1
                # hint-following diagnostic on the weights entering this step ({} unless due)
                models = (self.model, self.teacher.model)
                if self.shards is not None:  # unsharded copies on rank 0 (a collective when due)
                    models = self.shards.probe_models(self.step - 1, self.teacher.model)
                probe_row = self.dp.share(lambda m=models: self.probe.measure(self.step - 1, *m))
                try:
                    row = {**self.train_step(self.step), **probe_row}
                except PoolExhausted as exc:
                    self.step -= 1
                    if self.step:
                        self.save()
                    raise PoolExhausted(f"training stopped after step {self.step}: {exc}") from None
                except BaseException:
                    self.step -= 1
                    raise
                if heldout.due(cfg, self.step):
                    row.update(
                        self.dp.share(lambda: self.heldout.run(self.engine, self.tokenizer, self.step))
                    )
                if self.logger is not None:
                    self.logger.log(self.step, row)
                every = cfg.run.checkpoint_every
                if (every and self.step % every == 0) or self.step == cfg.run.steps:
                    self.save()
                try:
                    self.dp.share(lambda row=probe_row: self.probe.check(row))
                except HintFollowingEroded:
                    self.save()
                    raise
                if progress is not None:
                    progress[0].update(
                        progress[1],
                        advance=1,
                        info=f"reward {row['reward']:.2f} invalid {row['invalid_tool_rate']:.2f} sd "
                        f"{row['sd_loss']:.3f}",
                    )
        finally:
            if progress is not None:
                progress[0].stop()
            self.close()
            if self.logger is not None:
                self.logger.close()
                heldout.plot_curve(self.out, read_metrics(self.logger.path))
        return read_metrics(self.logger.path) if self.logger is not None else []

    def _extra_modules(self) -> dict[str, torch.nn.Module]:
        """Weights besides the policy that an exact resume needs: an EMA or frozen teacher, the KL
        reference."""
        if self.shards is not None:
            return self.shards.modules
        modules = {"teacher": self.teacher.model} if self.cfg.teacher.weights != "live" else {}
        if self.ref_model is not None:
            modules["reference"] = self.ref_model
        return modules

    def save(self) -> Path:
        """Checkpoint (written by rank 0, or DCP shards by every rank; all return when it is published)."""
        if self.shards is not None:
            return sharding.save_checkpoint(self, self.dp.share(self._state))
        return self.dp.share(self._save)

    def _state(self) -> dict[str, Any]:
        ahead = self.step + self.cfg.rollout.max_staleness
        pending = self.pipeline.ready() if self.pipeline is not None else {}
        return {
            "episodes": self.episodes,
            "dropped_stale": self.dropped_stale,
            "pending": {s: eps for s, (eps, _) in pending.items() if self.step < s <= ahead},
        }

    def _save(self) -> Path:
        state = self._state()
        return ckpt.save_checkpoint(
            self.out,
            self.step,
            self.model,
            self.optimizer,
            trainer_state=state,
            modules=self._extra_modules(),
            keep=self.cfg.run.keep_checkpoints,
        )

    def train_step(self, step: int) -> dict[str, Any]:
        """Rollouts -> drop the stale -> update -> sync the engine -> record the pool -> queue ahead."""
        t0 = time.perf_counter()
        if self._streams and self._engine_version is None:  # every rank: a resumed engine syncs collectively
            stream_sync.start_engine(self, step - 1)
            self._engine_version = step - 1
        episodes, stale_row, generate_s = self.dp.share(lambda: self._take(step))
        wait_s = time.perf_counter() - t0
        upd = self.learner.update(episodes, step=step) if episodes else UpdateResult()
        measure = self.cfg.run.measure_kl and not upd.skipped
        kl = self.learner.update_kl([e.rollout.tokens for e in episodes], upd.hinted) if measure else 0.0
        if self.shards is not None and not self._streams:  # every rank: new weights into rank 0's copy
            self.shards.refresh_rollout_copy(self.model)
        if self._streams:  # every rank streams the shards into rank 0's engine (stream_sync.stream_sync)
            sync_s = stream_sync.stream_sync(self, step)
            pool_row = self.dp.share(lambda: self._publish(step, synced=True))
        else:
            sync_s, pool_row = self.dp.share(lambda: self._publish(step))
        self.episodes += len(episodes)
        row = {"episodes": self.episodes, **metrics_row(episodes, upd, kl, pool_row), **stale_row}
        elapsed = time.perf_counter() - t0
        tokens = sum(len(e.rollout.tokens) for e in episodes)
        row.update(tokens_per_s=tokens / max(elapsed, 1e-9), rollout_s=wait_s, generate_s=generate_s,
                   sync_s=sync_s, step_s=elapsed)  # fmt: skip
        return row

    def _take(self, step: int) -> tuple[list[TrainEpisode], dict[str, Any], float]:
        """Rank 0: the step's rollouts with the stale dropped, the staleness metrics, generation seconds."""
        collected, generate_s = self._rollouts(step)
        episodes, stale_row = self._fresh(step, collected)
        r = self.cfg.rollout
        drawn, need = step_groups(r.tasks_per_step, r.oversample_groups, r.min_finished_groups)
        if need < drawn:  # long-tail control on: what it cut (absent otherwise, as before)
            stale_row.update(self._cuts.pop(step, CutCounts()).as_row())
        if not episodes and not any(e.rollout.tokens.turn_spans for e in collected):
            raise CadenzaError("no rollout produced a model turn; check rollout.max_new_tokens and the env")
        self._collected = collected
        return episodes, stale_row, generate_s

    def _publish(self, step: int, *, synced: bool = False) -> Any:
        """Rank 0, after the update: sync the engine, record the pool, queue the rollouts ahead."""
        sync_s = 0.0 if synced else self._sync_engine(step)
        pool_row = record_pool(self.source, step, self._collected)
        self._queue(step + self.cfg.rollout.max_staleness + 1)
        return pool_row if synced else (sync_s, pool_row)
