"""Trainer fixtures shared by the RL integration tests (registered in tests/integration/conftest.py).

``sft_model``: a tiny Qwen3 that has learnt toolworld's call format (head_dim 8: fast, hf engine only);
``sft_model_32``: the same with head_dim 32, which vLLM's CPU attention needs; ``config``: a small
toolworld training config over such a model; ``TIMING``: the metric keys that depend on wall time.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cadenza.experiments.warmup import warm_up_toolworld_model
from cadenza.rl.config import (
    EnvConfig,
    LossConfig,
    ModelConfig,
    OptimConfig,
    RolloutConfig,
    RunConfig,
    TrainConfig,
)
from tests.support.run_cache import build_once

TIMING = {"tokens_per_s", "rollout_s", "step_s", "generate_s", "sync_s"}


def _sft(out: Path, **arch) -> Path:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        losses = warm_up_toolworld_model(out, **arch)
        assert losses[-1] < losses[0] / 4
    finally:
        torch.set_num_threads(threads)
    return out


@pytest.fixture(scope="session")
def sft_model(tmp_path_factory) -> Path:
    """A tiny Qwen3 that has learnt toolworld's call format (and nothing about which alias fits a profile)."""
    return build_once(
        tmp_path_factory, "sft", lambda out: _sft(out, hidden_size=32, intermediate_size=64, head_dim=8)
    )


@pytest.fixture(scope="session")
def sft_model_32(tmp_path_factory) -> Path:
    """As ``sft_model`` with head_dim 32 (hidden 64, 2 heads): a model vLLM's CPU build can serve."""
    arch = dict(
        hidden_size=64, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32
    )
    return build_once(tmp_path_factory, "sft32", lambda out: _sft(out, **arch))


def config(model: Path, out: Path, steps: int, **loss) -> TrainConfig:
    return TrainConfig(
        run=RunConfig(out_dir=str(out), steps=steps, seed=3, checkpoint_every=2, progress=False, threads=1),
        model=ModelConfig(path=str(model)),
        env=EnvConfig(name="toolworld", options={"min_steps": 2, "max_steps": 2, "extra_turns": 1}),
        rollout=RolloutConfig(group_size=4, tasks_per_step=2, max_new_tokens=24, max_turns=3),
        loss=LossConfig(**loss),
        optim=OptimConfig(lr=3e-3, microbatch=4),
    )


def step_units(cfg, steps=(1, 2)) -> list:
    """The rollout units of ``steps`` (every sampled task of each step), as the trainer would make them."""
    from cadenza.rl.rollout.envs import load_source
    from cadenza.rl.rollout.episodes import sample_step_tasks
    from cadenza.rl.train.workers import Unit

    source = load_source(cfg.env.name, cfg.env.options)
    return [
        Unit(step=s, index=i, task=t) for s in steps for i, t in enumerate(sample_step_tasks(source, cfg, s))
    ]
