"""Pieces of the tool-hint experiment: the placebo is one token sequence in warm-up and RL, the supervised
control's targets, the fixed held-out set, and the goal's rules."""

from __future__ import annotations

import json
import random

from cadenza.agent.env import ToolCall
from cadenza.agent.trajectory import Trajectory, TurnMeta
from cadenza.experiments.corpus import corpus, tool_list_hint
from cadenza.experiments.heldout import heldout_tasks, supervised_examples
from cadenza.experiments.report import goal
from cadenza.experiments.toolworld import PROFILES, Step, ToolworldEnv, ToolworldSource, ToolworldTask
from cadenza.feedback.generate import FeedbackConfig, generate_hints
from cadenza.rl.rollout.loop import Rollout
from tests.support.rl_helpers import make_tokenizer


def test_placebo_reminder_is_the_rl_placebo_token_sequence():
    tok = make_tokenizer()

    def count(t: str) -> int:
        return len(tok.encode(t, add_special_tokens=False))

    by_chars, by_tokens = corpus(3, 40), corpus(3, 40, placebo_length=count)
    assert [len(t) for t in by_chars] == [len(t) for t in by_tokens]  # same random choices
    env = ToolworldEnv(ToolworldTask(id="t", profile="beta", steps=(Step(operation="read", path="main"),)))
    traj = Trajectory(task_id="t", turns=[TurnMeta(index=0, message_index=2, error_kind="tool_not_found")])
    [rl] = generate_hints(
        traj, env.tools(), FeedbackConfig(kinds=["tool_not_found"], placebo=True), length=count
    )
    hint = tool_list_hint(env)
    warm = [
        m["content"]
        for t in by_tokens
        for m in t
        if m["role"] == "user" and m["content"].startswith(rl.text.split()[0]) and "beta" in json.dumps(t[1])
    ]
    assert rl.text != hint and rl.text in warm  # the warm-up shows the very text the RL placebo arm inserts
    assert tok.encode(rl.text, add_special_tokens=False) == tok.encode(warm[warm.index(rl.text)])


def _episode(task: ToolworldTask, names: list[str]) -> tuple[Rollout, ToolworldEnv]:
    """A scripted episode: the calls ``names`` (with the pending step's path), as a rollout would record
    it."""
    env = ToolworldEnv(task)
    messages = env.reset()
    turns = []
    for i, name in enumerate(names):
        path = env._remaining[0].path
        messages.append({"role": "assistant", "content": f"call {name}"})
        res = env.step(ToolCall(name=name, arguments={"path": path}))
        turns.append(
            TurnMeta(
                index=i,
                message_index=len(messages) - 1,
                tool=name,
                error_kind=res.error_kind,
                extra={"calls": [{}]},
            )
        )
        messages.append({"role": "tool", "content": res.observation})
    traj = Trajectory(task_id=task.id, messages=messages, turns=turns)
    return Rollout(tokens=None, trajectory=traj, outcome=env.finish()), env


def test_supervised_targets_are_the_valid_call_for_the_pending_step():
    task = ToolworldTask(
        id="t",
        profile="gamma",
        steps=(Step(operation="read", path="main"), Step(operation="delete", path="log")),
    )
    # view (alpha's read) fails, cat_file works, rm (alpha's delete) fails, remove_file works
    res, env = _episode(task, ["view", "cat_file", "rm", "remove_file"])
    ex = supervised_examples([res], [env])
    assert len(ex) == 2
    for msgs, (at, name, path) in zip(ex, [(2, "cat_file", "main"), (6, "remove_file", "log")], strict=True):
        assert len(msgs) == at + 1 and msgs[:at] == res.trajectory.messages[:at]
        fn = msgs[-1]["tool_calls"][0]["function"]
        assert fn["name"] == name == PROFILES["gamma"][{"main": "read", "log": "delete"}[path]]
        assert json.loads(fn["arguments"]) == {"path": path}


def test_heldout_set_is_fixed_and_not_a_training_draw():
    a, b = heldout_tasks(16, 777), heldout_tasks(16, 777)
    assert a == b and a != heldout_tasks(16, 778)
    train = ToolworldSource().sample_tasks(random.Random(0 * 1_000_003 + 1), 16)
    assert [t.steps for t in a] != [t.steps for t in train]


def _run(seed: int, eps: int | None, success: float = 0.5, invalid: float = 0.2) -> dict:
    return {"seed": seed, "episodes_to_95": eps, "final_success": success, "final_invalid_rate": invalid}


def test_goal_rules():
    budget = {"episodes": 960}
    arms = {
        "grpo": [_run(0, None), _run(1, 900), _run(2, None), _run(3, 600), _run(4, None)],
        # seed 0: 600 <= 2 * 960 / 3; seed 1: 400 > 300; seed 3: 200 <= 200; seeds 2, 4: 640 <= 640
        "grpo_sd": [_run(0, 600), _run(1, 400), _run(2, 640), _run(3, 200), _run(4, 640, success=0.2)],
        "supervised": [_run(s, 320) for s in range(5)],
    }
    g = goal({"arms": arms, "budget": budget})
    assert g["sd_third_of_grpo"] == {"met": True, "seeds_ok": 4, "seeds": 5}
    assert g["sd_success_not_lower"]["met"] is False  # mean 0.44 vs 0.50
    assert g["placebo_within_noise"] == {"met": None}
    assert g["control_reaches_target"]["met"] is True
    arms["grpo_sd"][0] = _run(0, None)
    arms["placebo"] = [_run(s, None, invalid=0.2 + 0.01 * s) for s in range(5)]
    g = goal({"arms": arms, "budget": budget})
    assert g["sd_third_of_grpo"]["met"] is False and g["placebo_within_noise"]["met"] is False


def test_plot_curves_treats_unmeasured_points_as_gaps(tmp_path):
    """An eval where an arm measured no unhinted turn leaves None in its KL curve: the plot draws a gap
    there (the CI crash was numpy averaging None) and still writes the figure."""
    from cadenza.experiments.report import plot_curves

    run = {
        "heldout_curve": [[0, 0.5, 0.1], [8, 0.8, 0.3]],
        "probe_curve": [[0, 0.2], [8, 0.4]],
        "heldout_kl_curve": [[0, None, None], [8, 0.02, 1.1]],
    }
    unmeasured = {**run, "heldout_kl_curve": [[0, None, None], [8, None, None]]}
    out = tmp_path / "curves.png"
    plot_curves({"arms": {"grpo": [run, run], "grpo_sd": [unmeasured]}}, out)
    assert out.stat().st_size > 1000
