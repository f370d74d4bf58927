"""Choosing a backend by name: the one place that knows both ``local`` and ``ray`` (they import
:mod:`.base`, so :mod:`.base` cannot import them back)."""

from __future__ import annotations

from cadenza.executor.base import Executor, ExecutorConfig


def preflight(cfg: ExecutorConfig) -> None:
    """Fail in the first second for a backend that cannot work (not installed, address silent)."""
    if cfg.kind == "ray":
        from cadenza.executor.ray import preflight as ray_preflight

        ray_preflight(cfg)


def make_executor(cfg: ExecutorConfig) -> Executor:
    """The backend ``cfg.kind`` names; Ray is imported only when asked for."""
    if cfg.kind == "ray":
        from cadenza.executor.ray import RayExecutor

        return RayExecutor(cfg)
    from cadenza.executor.local import LocalExecutor

    return LocalExecutor(cfg)
