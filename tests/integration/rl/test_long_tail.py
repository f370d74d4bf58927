"""Long-tail control in a real training run: each step draws one group more than it trains on, one
task's grading never ends (a hung test run in its sandbox), and every step still ends, trains on the
groups that finished, and logs what was cut."""

from __future__ import annotations

import dataclasses
import random
import threading

from cadenza.rl.train.components import Components
from cadenza.rl.train.trainer import Trainer
from tests.support.rl_fixtures import config
from tests.support.rl_helpers import CounterEnv


class HungGrading(CounterEnv):
    """Its grading blocks until the test releases it."""

    release = threading.Event()

    def finish(self):
        HungGrading.release.wait(120)
        return super().finish()


class Source:
    """Tasks 0, 1, 2, ... in order; every third one's grading hangs."""

    def __init__(self) -> None:
        self.drawn: list[list[int]] = []

    def sample_tasks(self, rng: random.Random, n: int, start_index: int = 0) -> list[int]:
        self.drawn.append(list(range(start_index, start_index + n)))
        return self.drawn[-1]

    def make_env(self, task: int) -> CounterEnv:
        return HungGrading(target=3) if task % 3 == 1 else CounterEnv(target=3)


def test_steps_end_without_the_hung_group_and_count_the_cut(sft_model, tmp_path):
    cfg = config(sft_model, tmp_path / "run", steps=2, lambda_sd=0.0)
    cfg.rollout = dataclasses.replace(cfg.rollout, group_size=2, tasks_per_step=2, oversample_groups=1)
    source = Source()
    try:
        rows = Trainer(cfg, components=Components(source=source)).train()
    finally:
        HungGrading.release.set()
    assert source.drawn == [[0, 1, 2], [3, 4, 5]]  # tasks_per_step + oversample_groups per step
    for step, row in enumerate(rows, 1):
        assert (row["groups_cut"], row["episodes_cut"]) == (1, 2), row
        assert row["episodes"] == 4 * step  # two whole groups of two trained on per step
