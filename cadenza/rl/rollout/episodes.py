"""One step's episodes: tasks from the env source, rollouts through the engine, grading, monitor, hints.

Everything here may run on the rollout thread (:mod:`cadenza.rl.rollout.pipeline`) except
:func:`sample_step_tasks` and :func:`record_pool`, which touch the task pool and stay on the trainer's
thread. Randomness is a pure function of ``(seed, step)``: the task draw and the sampling generator of
step ``s`` are seeded from ``seed * 1_000_003 + s``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cadenza.agent.env import NoToolsView
from cadenza.agent.trajectory import Trajectory
from cadenza.errors import CadenzaError
from cadenza.feedback.generate import generate_hints
from cadenza.feedback.hints import Hint
from cadenza.rl.rollout.curriculum import drop_zero_variance
from cadenza.rl.rollout.longtail import CutCounts, step_groups
from cadenza.rl.rollout.loop import Rollout, RolloutTask, rollout
from cadenza.rl.rollout.monitor_hook import episode_outcome

if TYPE_CHECKING:
    from cadenza.rl.config import TrainConfig


@dataclass(kw_only=True)
class TrainEpisode:
    """One rollout with what the trainer derived from it."""

    rollout: Rollout
    tools: list[dict[str, Any]]  # real tool schemas (for feedback)
    render_tools: list[dict[str, Any]]  # what the prompt showed (for teacher inputs)
    hints: list[Hint] = field(default_factory=list)
    flags: int = 0

    @property
    def trajectory(self) -> Trajectory:
        return self.rollout.trajectory

    @property
    def policy_version(self) -> int:
        """The oldest weights that sampled any of its tokens."""
        return int(self.trajectory.meta.get("policy_version", 0))


def step_seed(cfg: TrainConfig, step: int) -> int:
    return cfg.run.seed * 1_000_003 + step


def sample_step_tasks(source: Any, cfg: TrainConfig, step: int) -> list[Any]:
    """The tasks of step ``step`` (trainer thread: a pool source reads its records)."""
    r = cfg.rollout
    n, _ = step_groups(
        r.tasks_per_step, r.oversample_groups, r.min_finished_groups
    )  # with the long tail's extra
    return source.sample_tasks(random.Random(step_seed(cfg, step)), n, (step - 1) * n)


def collect_episodes(
    engine: Any,
    tokenizer: Any,
    source: Any,
    cfg: TrainConfig,
    step: int,
    tasks: list[Any],
    *,
    seed: int | None = None,
    group_offset: int = 0,
    cut: CutCounts | None = None,
) -> list[TrainEpisode]:
    """Roll out ``tasks`` with ``engine``; read each episode's outcome (graded and monitored once, by the
    episode itself) and annotate it with hints.

    ``seed`` (default: the step's) and ``group_offset`` let a rollout worker run one task of a step
    on its own (:mod:`cadenza.rl.train.workers`). With long-tail control on (``rollout.min_finished_groups``
    below the groups drawn) only the groups that finished first come back; ``cut`` counts the others."""
    made: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = []

    def factory(task: Any):
        def make() -> Any:
            env = source.make_env(task)
            real = list(env.tools())
            shown = real if getattr(env, "show_tools", True) else []
            made.append((real, shown, decoy_tools(env) if cfg.feedback.decoy else real))
            return env if shown is real else NoToolsView(env)

        return make

    results = rollout(
        engine,
        tokenizer,
        [RolloutTask(task_id=str(getattr(t, "id", i)), make_env=factory(t)) for i, t in enumerate(tasks)],
        cfg.rollout,
        seed=step_seed(cfg, step) if seed is None else seed,
        group_offset=group_offset,
        finish_groups=_finish_groups(cfg, len(tasks)),
        cut=cut,
    )

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    episodes = []
    for res in results:
        real, shown, named = made[res.episode]
        ep = TrainEpisode(rollout=res, tools=real, render_tools=shown)
        verdict = episode_outcome(res.trajectory)  # graded and monitored once, by the episode
        ep.flags = len(verdict.flags)
        res.tokens.reward = verdict.reward
        if (cfg.loss.lambda_sd > 0 or cfg.loss.turn_penalty > 0) and cfg.feedback.kinds:
            errors: list[str] = []
            ep.hints = generate_hints(res.trajectory, named, cfg.feedback, length=count, errors=errors)
            for h in ep.hints:
                res.trajectory.turns[h.turn].hints.append(h.to_dict())
        episodes.append(ep)
    return episodes


def _finish_groups(cfg: TrainConfig, tasks: int) -> int:
    """Groups the rollout of ``tasks`` tasks must finish (0 = all: long-tail control off)."""
    r = cfg.rollout
    drawn, need = step_groups(r.tasks_per_step, r.oversample_groups, r.min_finished_groups)
    return need if need < drawn and tasks == drawn else 0


def decoy_tools(env: Any) -> list[dict[str, Any]]:
    """The tools a ``[feedback] decoy`` hint names: the env's ``decoy_tools()`` (one-line error if none)."""
    fn = getattr(env, "decoy_tools", None)
    if not callable(fn):
        raise CadenzaError(
            f"[feedback] decoy = true needs an env with decoy_tools(); {type(env).__name__} has none"
        )
    return list(fn())


def signal_rows(tokens: list[Any], drop: bool) -> tuple[set[int], int]:
    """Rows whose group's rewards vary (all rows when ``drop`` is off) and the zero-variance group count."""
    groups: dict[str, list[int]] = {}
    for i, t in enumerate(tokens):
        groups.setdefault(t.group_id, []).append(i)
    rows = list(groups.values())
    keep, dropped = drop_zero_variance([[tokens[i].reward for i in r] for r in rows])
    if not drop:
        return set(range(len(tokens))), dropped
    return {i for k in keep for i in rows[k]}, dropped


def record_pool(source: Any, step: int, episodes: list[Any]) -> dict[str, Any]:
    """Hand every rollout's outcome to a source that keeps a task pool (``record``); its metrics join the
    step's."""
    record = getattr(source, "record", None)
    if not callable(record):
        return {}
    from cadenza.rl.rollout.taskset import GroupOutcome

    outcomes = [
        GroupOutcome(
            task_id=e.rollout.tokens.group_id.split(":", 1)[1],
            reward=float(e.rollout.tokens.reward),
            resolved=bool(e.rollout.outcome.get("resolved")),
            flagged=e.flags > 0 or bool(e.trajectory.flags),
        )
        for e in episodes
    ]
    return dict(record(step, outcomes) or {})
