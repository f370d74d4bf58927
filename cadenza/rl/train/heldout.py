"""``[eval]``: held-out evaluation during training, logged as ``eval/*`` beside the step's metrics.

Every ``eval.every`` steps (and after the last) the policy, with the weights of that step, plays
``eval.episodes_per_task`` episodes on each held-out task: the env's own held-out split
(``source.heldout_tasks(n, seed)``, e.g. toolworld's) or a task set directory (``eval.tasks``). Greedy
decoding by default. The episodes are graded and monitored like training's, but nothing learns from them.
At the end of the run the curve is drawn to ``OUT/eval.png``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cadenza.errors import ConfigError

if TYPE_CHECKING:
    from cadenza.rl.config import TrainConfig

#: Metric keys this module adds (each prefixed with ``eval/``).
KEYS = ("reward", "resolved_rate", "valid_call_rate", "flagged_rate", "episodes")


class _TaskDirs:
    """A task set as an eval source: every task once, each an ``Episode`` in the sandbox."""

    def __init__(self, root: Path, max_turns: int) -> None:
        from cadenza.agent.evaluate import discover_tasks

        self.dirs = discover_tasks(root)
        self.max_turns = max_turns

    def heldout_tasks(self, n: int, seed: int = 0) -> list[Any]:
        from cadenza.rl.rollout.taskset import TaskRef

        return [TaskRef(d.name, d) for d in self.dirs[:n]]

    def make_env(self, task: Any) -> Any:
        from cadenza.agent.episode import Episode, EpisodeConfig

        env = Episode(task.dir, EpisodeConfig(max_turns=self.max_turns))
        env.show_tools = False
        return env


def due(cfg: TrainConfig, step: int) -> bool:
    """Is step ``step`` evaluated (every rank answers alike; only rank 0 plays the episodes)?"""
    every = cfg.eval.every
    return bool(every) and (step % every == 0 or step == cfg.run.steps)


class HeldOut:
    """The held-out tasks of a run and the rollout settings they are played with."""

    def __init__(self, cfg: TrainConfig, source: Any) -> None:
        ev = cfg.eval
        self.source = _TaskDirs(Path(ev.tasks), cfg.rollout.max_turns) if ev.tasks else source
        if not callable(getattr(self.source, "heldout_tasks", None)):
            raise ConfigError(
                f"eval.every = {ev.every} but env {cfg.env.name!r} has no held-out split (heldout_tasks); "
                "set eval.tasks to a task set directory, or eval.every = 0"
            )
        self.tasks = list(self.source.heldout_tasks(ev.num_tasks, ev.seed))
        if not self.tasks:
            raise ConfigError("eval found no held-out tasks; set eval.tasks to a task set that has some")
        temperature = 0.0 if ev.greedy else cfg.rollout.temperature
        rollout = dataclasses.replace(cfg.rollout, group_size=ev.episodes_per_task, temperature=temperature)
        self.cfg = dataclasses.replace(cfg, rollout=rollout)
        self.seed = ev.seed

    def run(self, engine: Any, tokenizer: Any, step: int) -> dict[str, float]:
        """``eval/*`` of the engine's current weights on the held-out tasks (no gradient)."""
        import torch

        from cadenza.rl.rollout.episodes import collect_episodes

        with torch.no_grad():
            eps = collect_episodes(engine, tokenizer, self.source, self.cfg, step, self.tasks, seed=self.seed)
        turns = [t for e in eps for t in e.trajectory.turns]
        n = max(1, len(eps))
        valid = sum(t.tool is not None and t.error_kind != "tool_not_found" for t in turns) / max(
            1, len(turns)
        )
        return {
            "eval/reward": sum(e.trajectory.reward or 0.0 for e in eps) / n,
            "eval/resolved_rate": sum(bool((e.trajectory.outcome or {}).get("resolved")) for e in eps) / n,
            "eval/valid_call_rate": valid,
            "eval/flagged_rate": sum(bool(e.trajectory.flags) for e in eps) / n,
            "eval/episodes": len(eps),
        }


def plot_curve(out_dir: Path, rows: list[dict[str, Any]]) -> Path | None:
    """``OUT/eval.png``: the ``eval/*`` rates against the step (``None`` when no row has them)."""
    points = [r for r in rows if "eval/reward" in r]
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for key in ("eval/reward", "eval/resolved_rate", "eval/valid_call_rate"):
        ax.plot([r["step"] for r in points], [r[key] for r in points], marker="o", label=key)
    ax.set_xlabel("step")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("held-out evaluation")
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    path = Path(out_dir) / "eval.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
