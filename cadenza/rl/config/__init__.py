"""Trainer configuration: the `[section]` dataclasses (:mod:`.sections`), their checks (:mod:`.checks`)."""

from cadenza.rl.config.checks import (
    engine_checks,
    ensure_valid,
    load_config,
    machine_checks,
    validate,
    validate_engine,
    validate_long_tail,
)
from cadenza.rl.config.sections import (
    EnvConfig,
    EvalConfig,
    LossConfig,
    ModelConfig,
    OptimConfig,
    ParallelDims,
    ProbeConfig,
    RolloutConfig,
    RolloutParams,
    RunConfig,
    TeacherConfig,
    TrainConfig,
)

__all__ = [
    "EnvConfig",
    "EvalConfig",
    "LossConfig",
    "ModelConfig",
    "OptimConfig",
    "ParallelDims",
    "ProbeConfig",
    "RolloutConfig",
    "RolloutParams",
    "RunConfig",
    "TeacherConfig",
    "TrainConfig",
    "engine_checks",
    "ensure_valid",
    "load_config",
    "machine_checks",
    "validate",
    "validate_engine",
    "validate_long_tail",
]
