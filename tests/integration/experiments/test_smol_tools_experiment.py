"""`cadenza experiment smol-tools --quick` on the real SmolLM2-135M-Instruct (offline): the whole pipeline
(gap, three arms through the shared runner, report) writes the documented outputs; a rerun resumes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cadenza.errors import CadenzaError
from cadenza.experiments.smol_tools import SmolConfig
from tests.support.lanes import engines_required


def _smollm2():
    from cadenza.rl.models import ensure_smollm2

    try:
        return ensure_smollm2()
    except CadenzaError as exc:  # the wheel is an optional extra (python -m cadenza.rl.engines.install)
        if engines_required():  # make test: the engine install brings it, so missing is a failure
            pytest.fail(str(exc))
        pytest.skip(str(exc))


@pytest.mark.slow
@pytest.mark.timeout(2400)  # a few CPU-minutes; far more wall time on a loaded shared machine
def test_quick_smol_tools_outputs(tmp_path):
    _smollm2()
    assert SmolConfig.quick().arms == ["grpo", "grpo_sd", "placebo"]  # the pre-registered arms, by default
    out = tmp_path / "smol"
    # two of the three arms (each costs a model load and a step on SmolLM2): plain GRPO differs from
    # GRPO + SD only in lambda_sd, which tests/unit/experiments/test_smol_tools.py checks
    cmd = [sys.executable, "-m", "cadenza", "experiment", "smol-tools", "--out", str(out), "--quick"]
    cmd += ["--arms", "grpo_sd,placebo"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "smoke test" in proc.stdout
    res = json.loads((out / "results.json").read_text())
    pre = res["pre_rl"]
    assert 0 <= pre["valid_without_hint"] <= 1 and 0 <= pre["valid_with_hint"] <= 1
    assert list(res["arms"]) == ["grpo_sd", "placebo"]
    step0 = json.loads((out / "step0.json").read_text())
    for arm, (run,) in res["arms"].items():
        assert run["seed"] == 0 and run["steps"] == 1, arm
        # every arm starts from the shared step-0 score; then one step of 1 task x 2 samples
        assert run["heldout_curve"][0] == [0, step0["invalid_rate"], step0["success_rate"]]
        assert [c[0] for c in run["heldout_curve"]] == [0, 2] and run["cpu_s"] > 0
        assert [c[0] for c in run["curve"]] == [2]
        assert run["probe_curve"], arm
    # frozen teacher: its diagnostic is the initial model's, equal across SD arms
    sd, pl = res["arms"]["grpo_sd"][0]["probe_curve"], res["arms"]["placebo"][0]["probe_curve"]
    assert sd[0][1] == pl[0][1]
    # both arms start from the same rollouts: identical first training batch
    assert res["arms"]["placebo"][0]["curve"][0] == res["arms"]["grpo_sd"][0]["curve"][0]
    cfg = json.loads((out / "runs" / "grpo_sd-seed0" / "config.json").read_text())
    assert cfg["model"]["trainable_layers"] == 4 and cfg["rollout"]["response_prefix"].startswith(
        "<tool_call>"
    )
    summary = (out / "summary.md").read_text()
    assert "Smoke-test scale" in summary and "| arm |" in summary and "Pre-RL gap" in summary
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)  # resumes: nothing to redo
    assert again.returncode == 0 and json.loads((out / "results.json").read_text())["arms"] == res["arms"]
