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


def _result(arm, seed, steps, digest, inv):
    return {"seed": seed, "steps": steps, "episodes_to_95": None, "final_success": 0.5,
            "final_invalid_rate": inv, "curve": [], "probe_curve": [],
            "heldout_curve": [[0, 0.6, 0.2], [steps * 32, inv, 0.5]],
            "heldout_kl_curve": [[0, 0.0, 0.1], [steps * 32, 0.02, 0.1]], "final_clean_success": 0.9,
            "final_other_errors": {"invalid_arguments": 0.0, "no_call": 0.01}, "final_unhinted_kl": 0.02,
            "final_unhinted_entropy": 0.1, "settings_digest": digest}  # fmt: skip


def test_report_only_names_interrupted_runs_and_uses_only_finished_ones(tmp_path):
    from dataclasses import asdict

    from cadenza.experiments.partial import report_only

    exp = ExperimentConfig.study2()
    exp.arms = ["grpo", "grpo_sd", "grpo_turn"]
    check_settings(tmp_path, exp)
    digest = settings_digest(asdict(exp))
    (tmp_path / "budget.json").write_text(
        json.dumps({"steps": 30, "episodes": 960, "source": "--budget-steps"})
    )
    for s in exp.seeds:
        (tmp_path / f"sft-seed{s}").mkdir()
        (tmp_path / f"sft-seed{s}" / "gap.json").write_text(
            '{"valid_with_hint": 0.9, "valid_without_hint": 0.3}'
        )
    Invocations(tmp_path)  # a run stopped by a signal: its wall time was never written
    for a, inv in (("grpo", 0.4), ("grpo_sd", 0.1)):
        for s in exp.seeds:
            d = tmp_path / "runs" / f"{a}-seed{s}"
            d.mkdir(parents=True)
            (d / "result.json").write_text(json.dumps(_result(a, s, 30, digest, inv + 0.01 * s)))
    d = tmp_path / "runs" / "grpo_turn-seed101"
    d.mkdir()
    (d / "heldout.jsonl").write_text('{"step": 0}\n{"step": 10}\n')
    lines: list[str] = []
    res = report_only(tmp_path, exp, log=lines.append)
    assert lines[0] == "grpo_turn seed 101: interrupted (at step 10 of 30); left out"
    assert "grpo_turn seed 102: interrupted (not started); left out" in lines
    assert res["complete"] is False and "grpo_turn" not in res["arms"]
    claims = res["study2"]["claims"]
    assert claims["sd_beats_grpo"]["verdict"] == "supported"  # -0.3 in every seed
    assert claims["words_beat_turn_credit"]["verdict"] == "not measured"
    summary = (tmp_path / "summary.md").read_text()
    assert (
        "**Interrupted (left out):**" in summary
        and "section 9" in summary
        and (tmp_path / "curves.png").exists()
    )
