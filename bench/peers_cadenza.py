"""The cadenza side of ``bench/peers.py``: cadenza's trainer on the shared settings, one step per ``go``.

A :class:`~cadenza.rl.train.trainer.Trainer` is built from a ``TrainConfig`` as a run would be (policy,
AdamW, the in-process ``hf`` engine sharing the trainer's module, the learner), with this file's
single-turn prompt source as its env (``env.name = "__main__:make_source"``). One step is what
:meth:`Trainer.train_step` does at ``max_staleness = 0``, run on this thread: the step's rollouts through
the engine (:meth:`Trainer.collect`), the shared reward on each completion, one update
(:meth:`Learner.update`: GRPO loss, backward, clip, AdamW step) and the engine's weight sync. It is
timed from ``go`` to the end of the sync; nothing runs between steps (the pipeline thread that would
start the next step's rollouts early is not used, so the two workers never compute at once).

The reward is applied after the rollout because cadenza's :class:`~cadenza.agent.env.Env` grades in
``finish()``, which does not see the final message; a single-turn string reward is scored on the
trajectory's last assistant message instead.

Usage (by bench/peers.py): ``python bench/peers_cadenza.py SETTINGS.json``.
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from peers_common import Settings, emit, make_prompts, vowel_reward, wait_go

from cadenza.agent.env import StepResult, ToolCall


class PromptEnv:
    """One prompt, one answer: no tools; ``finish`` leaves the reward to the caller (see the module doc)."""

    def __init__(self, prompt: str) -> None:
        self.prompt = prompt

    def reset(self) -> list[dict[str, Any]]:
        return [{"role": "user", "content": self.prompt}]

    def tools(self) -> list[dict[str, Any]]:
        return []

    def step(self, call: ToolCall) -> StepResult:  # a random model may emit a tool-call block: end there
        return StepResult(observation="no tools here", done=True)

    def finish(self) -> dict[str, Any]:
        return {"reward": 0.0, "resolved": False}


class PromptSource:
    """Task ``i`` is prompt ``i``; step ``s`` takes tasks ``(s - 1) * n .. s * n - 1`` (TRL's order)."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.prompts = make_prompts(int(options["n"]), int(options["seed"]), int(options["words"]))

    def sample_tasks(self, rng: random.Random, n: int, start_index: int = 0) -> list[int]:
        return [(start_index + i) % len(self.prompts) for i in range(n)]

    def make_env(self, task: int) -> PromptEnv:
        return PromptEnv(self.prompts[task])


def make_source(options: dict[str, Any]) -> PromptSource:
    return PromptSource(options)


def build_trainer(s: Settings, out: Path) -> Any:
    from cadenza.rl.config import (
        EnvConfig,
        LossConfig,
        ModelConfig,
        OptimConfig,
        ProbeConfig,
        RolloutConfig,
        RunConfig,
        TrainConfig,
    )
    from cadenza.rl.train.trainer import Trainer

    cfg = TrainConfig(
        run=RunConfig(
            out_dir=str(out),
            steps=s.total_steps,
            seed=s.seed,
            progress=False,
            threads=s.threads,
            measure_kl=False,
        ),
        model=ModelConfig(path=s.model_dir, dtype="float32"),
        env=EnvConfig(
            name="__main__:make_source",
            options={"n": s.prompts_per_step * s.total_steps, "seed": s.seed, "words": s.prompt_words},
        ),
        rollout=RolloutConfig(
            group_size=s.group_size,
            tasks_per_step=s.prompts_per_step,
            max_new_tokens=s.max_new_tokens,
            max_turns=1,
            temperature=s.temperature,
            max_staleness=0,
            engine="hf",
        ),
        # GRPO only (no SD, no reference), symmetric clip, token mean, every group kept: TRL's loss
        loss=LossConfig(
            lambda_sd=0.0,
            clip_eps=s.clip_eps,
            clip_eps_high=s.clip_eps,
            aggregation="token_mean",
            std_normalize=True,
            drop_zero_variance=False,
            kl_ref=0.0,
        ),
        optim=OptimConfig(
            name="adamw",
            lr=s.lr,
            betas=list(s.betas),
            weight_decay=0.0,
            grad_clip=s.grad_clip,
            microbatch=s.prompts_per_step * s.group_size,  # one forward/backward, as TRL's batch
        ),
        probe=ProbeConfig(every=0),
    )
    return Trainer(cfg, resume=False)


def run_step(trainer: Any, step: int) -> dict[str, Any]:
    """One synchronous step (rollouts, reward, update, sync), timed."""
    t0, c0 = time.perf_counter(), time.process_time()
    episodes = trainer.collect(step)
    rewards = []
    for e in episodes:
        last = e.rollout.trajectory.messages[-1]
        r = vowel_reward(str(last.get("content") or "")) if last.get("role") == "assistant" else 0.0
        e.rollout.tokens.reward = e.rollout.trajectory.reward = r
        rewards.append(r)
    t1 = time.perf_counter()
    upd = trainer.learner.update(episodes, step=step)
    trainer.engine.sync_weights(trainer._weights(), version=step)
    step_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    tokens = [e.rollout.tokens for e in episodes]
    model_tokens = sum(t.num_model_tokens for t in tokens)
    import torch

    return {
        "step": step,
        "step_s": step_s,
        "generate_s": t1 - t0,
        "update_s": step_s - (t1 - t0),
        "cpu_s": cpu_s,
        "completion_tokens": model_tokens,
        "prompt_tokens": sum(len(t) for t in tokens) - model_tokens,
        "reward": sum(rewards) / len(rewards),
        "skipped": upd.skipped,
        "threads": torch.get_num_threads(),
        "optimizer": type(trainer.optimizer).__name__,
    }


def main(settings_path: str) -> None:
    s = Settings.load(settings_path)
    import torch

    torch.set_num_threads(s.threads)
    out = Path(tempfile.mkdtemp(prefix="cadenza_run_", dir=Path(settings_path).parent))
    trainer = build_trainer(s, out)
    params = sum(p.numel() for p in trainer.model.parameters())
    emit({"ready": True, "versions": {"torch": torch.__version__}, "params": params})
    try:
        step = 0
        while wait_go():
            step += 1
            emit(run_step(trainer, step))
    finally:
        trainer.close()


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if len(sys.argv) != 2:
        raise SystemExit("usage: peers_cadenza.py SETTINGS.json (run by bench/peers.py)")
    main(sys.argv[1])
