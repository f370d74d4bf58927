"""The trainer's view of an episode's verdict: the episode's own :class:`~cadenza.agent.outcome.Outcome`.

The episode grades and monitors once, with the task's context (see :mod:`cadenza.agent.outcome`); the
trainer never runs a second, weaker monitor pass. It reads the reward and the flags from the stored
outcome, so a flagged episode has reward 0 and counts as flagged in the task pool.
"""

from __future__ import annotations

from cadenza.agent.outcome import Outcome
from cadenza.agent.trajectory import Trajectory


def episode_outcome(traj: Trajectory) -> Outcome:
    """The outcome ``env.finish()`` returned (stored on the rollout's trajectory), flags on the trajectory."""
    out = Outcome.from_dict(traj.outcome if isinstance(traj.outcome, dict) else {})
    known = {(f.rule, f.turn) for f in traj.flags}
    traj.flags.extend(f for f in out.flags if (f.rule, f.turn) not in known)
    traj.reward = out.reward
    return out
