"""The trainer's seams, used as a user would: their own task source and env, their own loss, optimizer and
metrics sink, passed in through :class:`cadenza.rl.train.components.Components`, with no change to
cadenza. The run trains (the weights move, every row reaches the sink) on the user's env only."""

from __future__ import annotations

import random

import torch

from cadenza.rl.learn.step import rl_losses
from cadenza.rl.train.components import Components
from cadenza.rl.train.trainer import Trainer
from tests.support.rl_fixtures import config
from tests.support.rl_helpers import CounterEnv


class CounterSource:
    """A user's task source: counting tasks, each a fresh :class:`CounterEnv`."""

    def __init__(self) -> None:
        self.envs = 0

    def sample_tasks(self, rng: random.Random, n: int, start_index: int = 0) -> list[int]:
        return [rng.randint(2, 5) for _ in range(n)]

    def make_env(self, task: int) -> CounterEnv:
        self.envs += 1
        return CounterEnv(target=task)


class Sink:
    def __init__(self) -> None:
        self.rows: list[tuple[int, dict]] = []
        self.closed = False

    def log(self, step: int, row: dict) -> None:
        self.rows.append((step, row))

    def close(self) -> None:
        self.closed = True


def test_trainer_runs_on_a_user_env_loss_optimizer_and_sink(sft_model, tmp_path):
    calls = {"loss": 0, "optim": 0}

    def my_loss(*args, **kwargs):  # the user's loss: cadenza's, counted
        calls["loss"] += 1
        return rl_losses(*args, **kwargs)

    def my_optimizer(model, cfg):
        calls["optim"] += 1
        return torch.optim.SGD(model.parameters(), lr=0.05)

    cfg = config(sft_model, tmp_path / "run", steps=2, lambda_sd=1.0)
    cfg.env.name = "no.such.module:factory"  # never read: the source is passed in
    source, sink = CounterSource(), Sink()
    trainer = Trainer(
        cfg, components=Components(source=source, loss=my_loss, optimizer=my_optimizer, logger=sink)
    )
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    rows = trainer.train()
    assert [r["step"] for r in rows] == [1, 2] and [s for s, _ in sink.rows] == [1, 2] and sink.closed
    assert source.envs == 2 * cfg.rollout.tasks_per_step * cfg.rollout.group_size
    assert calls["optim"] == 1 and calls["loss"] >= 2
    assert isinstance(trainer.optimizer, torch.optim.SGD)
    moved = any(not torch.equal(before[k], v) for k, v in trainer.model.named_parameters())
    assert moved, "no update reached the weights"


def test_the_loss_passed_in_is_the_one_trained_on(sft_model, tmp_path):
    """A loss whose terms are all zero: SGD without momentum then leaves every weight as it was (with
    cadenza's own loss the same run moves them, above)."""

    def zero_loss(*args, **kwargs):
        out = rl_losses(*args, **kwargs)
        out.grpo = 0.0 * out.grpo
        out.sd.loss = 0.0 * out.sd.loss
        return out

    cfg = config(sft_model, tmp_path / "run", steps=1, lambda_sd=1.0)
    trainer = Trainer(
        cfg,
        components=Components(
            source=CounterSource(),
            loss=zero_loss,
            optimizer=lambda model, cfg: torch.optim.SGD(model.parameters(), lr=0.05),
        ),
    )
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    trainer.train()
    assert all(torch.equal(before[k], v) for k, v in trainer.model.named_parameters())
