"""Environment sources for the trainer, pluggable by name.

A *source* hands out tasks and builds one :class:`cadenza.agent.env.Env` per rollout:
``sample_tasks(rng, n, start_index) -> list[task]`` and ``make_env(task) -> Env``. Built-in names map
to factories; any ``package.module:function`` taking the ``[env] options`` table works too, so the
real agent episode (or a user's own environment) plugs in without touching the trainer.
"""

from __future__ import annotations

import importlib
import random
from typing import Any, Protocol

from cadenza.agent.env import Env
from cadenza.errors import ConfigError

BUILTIN_ENVS = {
    "toolworld": "cadenza.experiments.toolworld:make_source",
    "taskset": "cadenza.rl.rollout.taskset:make_source",
}
SANDBOXED_ENVS = frozenset({"taskset"})  # built-in envs whose episodes run in bubblewrap (checked up front)


class EnvSource(Protocol):
    def sample_tasks(self, rng: random.Random, n: int, start_index: int = 0) -> list[Any]: ...

    def make_env(self, task: Any) -> Env: ...


def load_source(name: str, options: dict[str, Any]) -> EnvSource:
    target = BUILTIN_ENVS.get(name, name)
    if ":" not in target:
        raise ConfigError(
            f"env.name {name!r} is not a known environment ({', '.join(BUILTIN_ENVS)}) nor "
            "'package.module:factory'"
        )
    module_name, func_name = target.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"env {name!r} needs module {module_name!r}, which is not available ({exc.name} missing)"
        ) from None
    factory = getattr(module, func_name, None)
    if not callable(factory):
        raise ConfigError(f"env {name!r}: {module_name} has no factory {func_name!r}")
    source = factory(dict(options))
    for method in ("sample_tasks", "make_env"):
        if not callable(getattr(source, method, None)):
            raise ConfigError(
                f"env {name!r}: the factory's result has no {method}(); see cadenza.rl.rollout.envs.EnvSource"
            )
    return source
