"""The trainer's seams: the environment source, the rollout engine, the loss, the optimizer and a metrics
sink are each built by a named builder from the config, or passed in (:class:`Components`).

Passing a part in needs no change to cadenza: a user's task source and env
(:class:`~cadenza.rl.rollout.envs.EnvSource`), an engine builder with :func:`build_engine`'s signature,
a loss with :func:`~cadenza.rl.learn.step.rl_losses`'s signature and result (the learner weighs its
``grpo`` and ``sd.loss`` terms per microbatch), an optimizer builder with
:func:`~cadenza.rl.train.build.build_optimizer`'s, and a sink that gets every metrics row besides the
run's own ``metrics.jsonl`` (which resume reads, so it is always written).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from cadenza.rl.learn.step import rl_losses
from cadenza.rl.rollout.envs import EnvSource, load_source

if TYPE_CHECKING:
    from cadenza.rl.config import TrainConfig


class MetricSink(Protocol):
    def log(self, step: int, row: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


#: ``(cfg, policy, tokenizer, version) -> RolloutEngine`` (:func:`cadenza.rl.train.local_engine.build_engine`)
EngineBuilder = Callable[..., Any]
#: ``(model, cfg) -> torch.optim.Optimizer`` (:func:`cadenza.rl.train.build.build_optimizer`)
OptimizerBuilder = Callable[[torch.nn.Module, Any], torch.optim.Optimizer]


@dataclass(kw_only=True)
class Components:
    """Parts to use instead of the ones the config names (``None``: built from the config)."""

    source: EnvSource | None = None  # tasks and their envs (default: ``[env] name`` and ``options``)
    engine: EngineBuilder | None = None  # builds the rollout engine (default: ``[rollout] engine``)
    loss: Callable[..., Any] | None = None  # the per-microbatch losses (default: ``rl_losses``, ``[loss]``)
    optimizer: OptimizerBuilder | None = None  # default: ``[optim]`` (AdamW, or Muon + AdamW)
    logger: MetricSink | None = None  # gets every metrics row too (JSONL, TensorBoard, wandb stay)

    def build_source(self, cfg: TrainConfig) -> EnvSource:
        return self.source if self.source is not None else load_source(cfg.env.name, cfg.env.options)

    @property
    def loss_fn(self) -> Callable[..., Any]:
        return self.loss or rl_losses

    def with_sink(self, logger: Any) -> Any:
        """The run's logger, feeding :attr:`logger` as well when one was passed."""
        return logger if self.logger is None else _Tee(logger, self.logger)


class _Tee:
    """The run's :class:`cadenza.metrics.MetricsLogger` and a user's sink, fed the same rows."""

    def __init__(self, main: Any, sink: MetricSink) -> None:
        self.main, self.sink = main, sink

    @property
    def path(self) -> Path:
        return self.main.path

    def log(self, step: int, row: dict[str, Any]) -> None:
        self.main.log(step, row)
        self.sink.log(step, dict(row))

    def close(self) -> None:
        try:
            self.main.close()
        finally:
            self.sink.close()
