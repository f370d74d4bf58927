"""Study 2's pieces: the arms' trainer settings, the wrong-words hint, provenance (code, settings, wall
time, one-line refusals) and the paired verdict rule."""

from __future__ import annotations

import json
from statistics import mean, stdev

import pytest

from cadenza.errors import CadenzaError, ConfigError
from cadenza.experiments import report2
from cadenza.experiments.provenance import Invocations, check_results, code_version, settings_digest
from cadenza.experiments.study import check_settings
from cadenza.experiments.tool_hints import STUDY1_ARMS, STUDY2_ARMS, ExperimentConfig, train_config
from cadenza.experiments.toolworld import PROFILES, ToolworldEnv, ToolworldTask
from cadenza.feedback.generate import FeedbackConfig
from cadenza.feedback.rules import tool_names


def test_arms_differ_from_grpo_only_where_the_protocol_says(tmp_path):
    exp = ExperimentConfig.study2()
    cfg = {a: train_config(exp, a, 101, tmp_path, tmp_path, 1) for a in STUDY2_ARMS}
    assert cfg["grpo_turn"].loss.turn_penalty == exp.turn_penalty > 0 and cfg["grpo_turn"].loss.lambda_sd == 0
    assert cfg["grpo_turn"].feedback.kinds == ["tool_not_found"]  # the turns come from the same rule
    assert cfg["sd_no_words"].feedback.placement == "none" and cfg["sd_no_words"].loss.lambda_sd == 1
    assert cfg["sd_wrong_words"].feedback.decoy and cfg["grpo_sd"].feedback.placement == "user_before_turn"
    assert all(c.teacher.weights == "frozen" for c in cfg.values())
    assert cfg["grpo"].loss.turn_penalty == 0 and not cfg["grpo"].feedback.kinds
    assert ExperimentConfig().arms == list(STUDY1_ARMS)  # `tool-hints` alone still runs study 1
    assert not set(exp.seeds) & set(range(5))  # fresh seeds


def test_wrong_words_name_another_profiles_tools():
    env = ToolworldEnv(ToolworldTask(id="t", profile="alpha", steps=()))
    own, decoy = set(tool_names(env.tools())), set(tool_names(env.decoy_tools()))
    assert own == set(PROFILES["alpha"].values()) and decoy in [set(p.values()) for p in PROFILES.values()]
    assert decoy != own
    with pytest.raises(ConfigError, match="at most one"):
        FeedbackConfig(placebo=True, decoy=True).validate()


def test_provenance_records_code_and_refuses_another_commit(tmp_path):
    code = code_version()
    assert len(code["commit"]) == 40 and isinstance(code["dirty"], bool)
    calls = Invocations(tmp_path)
    calls.entries[-1]["wall_s"] = 0.0
    again = Invocations(tmp_path)  # same code: a resume, the wall time adds up
    again.entries[0]["wall_s"] = 7.5
    again.save()
    assert len(again.entries) == 2 and again.wall_s_total >= 7.5
    data = json.loads((tmp_path / "provenance.json").read_text())
    data["invocations"][0]["code"]["commit"] = "0" * 40
    (tmp_path / "provenance.json").write_text(json.dumps(data))
    with pytest.raises(CadenzaError, match=r"run by code 0000000000.*--allow-code-change") as e:
        Invocations(tmp_path)
    assert "\n" not in str(e.value)
    assert len(Invocations(tmp_path, allow_code_change=True).commits) == 2


def test_results_with_other_settings_or_interrupted_are_one_line(tmp_path):
    exp = ExperimentConfig.study2()
    d = settings_digest(vars(exp) | {})
    ok = {"seed": 101, "steps": 40, "settings_digest": d}
    check_results({"grpo": [ok], "supervised": [dict(ok, steps=12)]}, d, 40, control_stops=True)
    with pytest.raises(CadenzaError, match="grpo seed 101 was run with other settings"):
        check_results({"grpo": [dict(ok, settings_digest="x")]}, d, 40, False)
    with pytest.raises(CadenzaError, match="stopped at step 12 of 40 \\(interrupted\\)"):
        check_results({"supervised": [dict(ok, steps=12)]}, d, 40, control_stops=False)
    assert settings_digest(vars(exp) | {"arms": ["grpo"]}) == d  # a selection is not a setting


def test_a_study1_directory_without_the_new_fields_still_resumes(tmp_path):
    exp = ExperimentConfig.quick()
    check_settings(tmp_path, exp)
    pinned = json.loads((tmp_path / "settings.json").read_text())
    for k in ("turn_penalty", "control_stops_at_target"):
        pinned.pop(k)
    (tmp_path / "settings.json").write_text(json.dumps(pinned))
    check_settings(tmp_path, exp)  # ran with the defaults of the fields added since
    exp.turn_penalty = 2.0
    with pytest.raises(CadenzaError, match="turn_penalty"):
        check_settings(tmp_path, exp)


def _runs(a, b):
    return {
        "A": [{"seed": i, "x": v} for i, v in enumerate(a)],
        "B": [{"seed": i, "x": v} for i, v in enumerate(b)],
    }


def test_paired_interval_and_verdicts():
    a, b = [0.10, 0.05, 0.20, 0.02], [0.40, 0.30, 0.35, 0.50]
    p = report2.paired(_runs(a, b), "A", "B", "x")
    d = [x - y for x, y in zip(a, b, strict=True)]
    half = 3.182 * stdev(d) / len(d) ** 0.5  # t(0.975, df 3)
    assert p["mean"] == pytest.approx(mean(d)) and p["ci95"] == pytest.approx(
        [mean(d) - half, mean(d) + half]
    )
    assert report2.verdict(p) == "supported"
    assert (
        report2.verdict(report2.paired(_runs([0.3, 0.31, 0.29], [0.3, 0.3, 0.3]), "A", "B", "x"))
        == "falsified"
    )
    assert (
        report2.verdict(report2.paired(_runs([0.1, 0.5, 0.2], [0.3, 0.3, 0.3]), "A", "B", "x"))
        == "inconclusive"
    )
    assert report2.verdict(report2.paired(_runs([0.1], [0.3]), "A", "B", "x")) == "not measured"
