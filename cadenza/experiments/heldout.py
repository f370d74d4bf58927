"""Held-out scoring and the supervised control of the tool-hint experiment.

* :func:`heldout_tasks` / :func:`evaluate`: a fixed set of toolworld tasks, identical for every arm and
  seed, rolled out one sample each at a fixed sampling seed; the valid-call and success rates.
* :func:`supervised_examples`: for each turn that called a tool the profile lacks, the context up to
  that turn and the valid call for the operation that was pending then (the positive control's target).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Protocol

from cadenza.agent.env import NoToolsView
from cadenza.experiments.corpus import call_message
from cadenza.experiments.toolworld import ToolworldConfig, ToolworldEnv, ToolworldTask, sample_task


def heldout_tasks(n: int, seed: int, config: ToolworldConfig | None = None) -> list[ToolworldTask]:
    """``n`` tasks from a seed space of their own (training draws from ``random.Random(int)``)."""
    rng = random.Random(f"toolworld-heldout-{seed}")
    return [sample_task(rng, config or ToolworldConfig(), i) for i in range(n)]


class ArmExperiment(Protocol):
    """What the shared runner (this module and :mod:`.arms`) asks of an experiment's config: study 1 and
    2's :class:`~cadenza.experiments.tool_hints.ExperimentConfig` and the real model's
    :class:`~cadenza.experiments.smol_tools.SmolConfig` both provide it."""

    seeds: list[int]
    arms: list[str]
    tasks_per_step: int
    group_size: int
    rl_lr: float
    temperature: float
    max_new_tokens: int
    eval_every: int
    heldout_tasks: int
    heldout_seed: int
    target: float
    probe_items: int
    threads: int
    window: int

    @property
    def episodes_per_step(self) -> int: ...

    @property
    def toolworld(self) -> ToolworldConfig: ...

    @property
    def response_prefix(self) -> str: ...

    def train_config(self, arm: str, seed: int, model_dir: Path, out_dir: Path, steps: int) -> Any: ...


def run_episodes(
    policy: Any, tokenizer: Any, tasks: list[ToolworldTask], *, group_size: int, seed: int, exp: ArmExperiment
) -> tuple[list[Any], list[ToolworldEnv]]:
    """Roll out ``group_size`` episodes per task; also return the envs (in the same order)."""
    from cadenza.rl.rollout.loop import RolloutParams, RolloutTask, rollout

    envs: list[ToolworldEnv] = []
    cfg = exp.toolworld

    def factory(task: ToolworldTask):
        def make() -> Any:
            env = ToolworldEnv(task, cfg)
            envs.append(env)
            return NoToolsView(env)

        return make

    params = RolloutParams(
        group_size=group_size,
        max_turns=cfg.max_steps + cfg.extra_turns,
        max_new_tokens=exp.max_new_tokens,
        temperature=exp.temperature,
        response_prefix=exp.response_prefix,
    )
    results = rollout(
        policy, tokenizer, [RolloutTask(task_id=t.id, make_env=factory(t)) for t in tasks], params, seed=seed
    )
    return results, envs


def rates(results: list[Any]) -> dict[str, float]:
    """Valid-call, invalid (1 - valid) and success rates over episodes' turns (the trainer's definitions)."""
    turns = [t for r in results for t in r.trajectory.turns]
    n = max(1, len(turns))
    valid = sum(t.tool is not None and t.error_kind != "tool_not_found" for t in turns) / n
    return {
        "valid_call_rate": valid,
        "invalid_rate": 1.0 - valid,
        "success_rate": sum(bool(r.outcome.get("resolved")) for r in results) / max(1, len(results)),
    }


def evaluate(
    policy: Any, tokenizer: Any, tasks: list[ToolworldTask], seed: int, exp: ArmExperiment, start: Any = None
) -> dict[str, Any]:
    """Held-out rates of ``policy`` (no gradient; the same sampling seed for every arm); with ``start``
    (the run's initial policy) also the targeted measures (:mod:`cadenza.experiments.targeted`)."""
    import torch

    from cadenza.experiments import targeted

    with torch.no_grad():
        results, _ = run_episodes(policy, tokenizer, tasks, group_size=1, seed=seed, exp=exp)
    out: dict[str, Any] = dict(rates(results))
    if start is not None:
        out["other_errors"] = targeted.other_error_rates(results)
        out |= targeted.unhinted_kl_entropy(policy, start, results) | targeted.episode_flags(results)
    return out


def supervised_examples(results: list[Any], envs: list[ToolworldEnv]) -> list[list[dict[str, Any]]]:
    """Messages ending with the valid call, one per turn that called a missing tool."""
    examples = []
    for res, env in zip(results, envs, strict=True):
        traj = res.trajectory
        call_index = 0  # env.pending has one entry per executed call; a turn may hold several calls
        for turn in traj.turns:
            pending = env.pending[call_index] if call_index < len(env.pending) else None
            call_index += len(turn.extra.get("calls", []))
            if turn.error_kind != "tool_not_found" or pending is None:
                continue
            name, args = env.correct_call(pending)
            target = call_message(name, args["path"], turn.index)
            examples.append([*traj.messages[: turn.message_index], target])
    return examples
