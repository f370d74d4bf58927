"""`cadenza experiment tool-hints --quick`: the outputs' structure and the measured pre-RL gap."""

from __future__ import annotations

import json
import subprocess
import sys

from cadenza.experiments.report import ARMS


def test_quick_tool_hints_experiment_outputs(tmp_path):
    out = tmp_path / "exp"
    proc = subprocess.run(
        [sys.executable, "-m", "cadenza", "experiment", "tool-hints", "--out", str(out), "--quick"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    pre = results["pre_rl"]
    assert set(pre) == {"valid_with_hint", "valid_without_hint"}
    # the SFT policy uses a listed tool when told, and guesses among 3 aliases otherwise
    assert pre["valid_with_hint"] > 0.8 and 0.15 < pre["valid_without_hint"] < 0.6
    assert list(results["arms"]) == list(ARMS)
    steps, per_step = (
        results["config"]["rl_steps"],
        results["config"]["tasks_per_step"] * results["config"]["group_size"],
    )
    for arm, runs in results["arms"].items():
        assert len(runs) == 1, arm
        run = runs[0]
        assert set(run) == {"seed", "episodes_to_95", "final_success", "final_invalid_rate", "curve"}
        assert run["seed"] == 0 and (run["episodes_to_95"] is None or isinstance(run["episodes_to_95"], int))
        assert [c[0] for c in run["curve"]] == [per_step * (i + 1) for i in range(steps)]
        assert all(0 <= c[1] <= 1 and 0 <= c[2] <= 1 for c in run["curve"])
        assert 0 <= run["final_success"] <= 1 and 0 <= run["final_invalid_rate"] <= 1
    # every arm starts from the same policy on the same tasks: identical first rollouts
    assert len({json.dumps(r[0]["curve"][0]) for r in results["arms"].values()}) == 1
    summary = (out / "summary.md").read_text()
    assert "P(valid | tool list in context)" in summary and "| arm |" in summary
    assert sum(line.startswith("| GRPO") for line in summary.splitlines()) == 4
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
