"""Optional reward-hacking monitor in the training loop.

If :mod:`cadenza.monitor` is importable and exposes a callable ``monitor(traj) -> list[Flag]`` (or
``check_trajectory``), flagged trajectories get their flags recorded and their reward zeroed,
so the policy is never paid for hacking. Without a monitor the hook does nothing.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from cadenza.agent.trajectory import Trajectory

_CANDIDATES = ("monitor", "check_trajectory")


def find_monitor() -> Callable[[Trajectory], list[Any]] | None:
    try:
        module = importlib.import_module("cadenza.monitor")
    except ImportError:
        return None
    for name in _CANDIDATES:
        fn = getattr(module, name, None)
        if callable(fn):
            return fn
    return None


def apply_monitor(
    monitor: Callable[[Trajectory], list[Any]] | None, traj: Trajectory, reward: float
) -> tuple[float, int]:
    """Return the (possibly zeroed) reward and the number of flags raised."""
    if monitor is None:
        return reward, 0
    flags = list(monitor(traj) or [])
    if flags:
        traj.flags.extend(flags)
        return 0.0, len(flags)
    return reward, 0
