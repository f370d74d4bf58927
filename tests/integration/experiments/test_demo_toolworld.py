"""The toolworld phase of ``cadenza demo`` at a tiny budget: the experiment runner really runs both arms, the
plot is written, and every number of the closing table is the one in ``results.json``."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from rich.console import Console

from cadenza.errors import CadenzaError
from cadenza.experiments.demo import (
    ARM_NAMES,
    ToolworldDemoConfig,
    outcome_line,
    prepare,
    run_toolworld_demo,
    start_warm_up,
    toolworld_table,
)

TINY = dict(steps=2, eval_every=1, heldout_tasks=6, sft_steps=12, corpus_size=64, gap_tasks=6, probe_items=2)


@pytest.fixture(autouse=True)
def _restore_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def phase(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "toolworld"
    cfg = ToolworldDemoConfig(**TINY, workers=2)
    warm_up = start_warm_up(out, cfg)  # in a process of its own, as beside the demo's real-task phase
    return out, run_toolworld_demo(out, cfg, log=lambda m: None, warm_up=warm_up)


def _table_rows(result) -> dict[str, list[str]]:
    console = Console(record=True, width=220)
    console.print(toolworld_table(result))
    rows = {}
    for line in console.export_text().splitlines():
        cells = [c.strip() for c in line.strip("│┃ ").split("│")]
        if cells and cells[0] in ARM_NAMES.values():
            rows[cells[0]] = cells[1:]
    return rows


def test_phase_writes_plot_and_table_from_results(phase) -> None:
    out, result = phase
    assert result.plot == out.parent / "toolworld_heldout.png"
    assert result.plot.is_file() and result.plot.stat().st_size > 5000
    saved = json.loads((out / "results.json").read_text())  # what the runner wrote, read back from disk
    assert set(saved["arms"]) == {"grpo", "grpo_sd"}
    rows = _table_rows(result)
    assert set(rows) == set(ARM_NAMES.values())
    for arm, name in ARM_NAMES.items():
        (run,) = saved["arms"][arm]
        curve = run["heldout_curve"]
        assert len(curve) == TINY["steps"] // TINY["eval_every"] + 1  # step 0 and every eval_every steps
        want = [
            str(run["steps"]),
            str(curve[-1][0]),
            f"{curve[0][1]:.3f}",
            f"{curve[-1][1]:.3f}",
            f"{curve[0][2]:.3f}",
            f"{curve[-1][2]:.3f}",
        ]
        assert rows[name] == want, (arm, rows[name], want)
        assert run["steps"] == TINY["steps"] and curve[-1][0] == TINY["steps"] * 32
    line = outcome_line(result)
    finals = [saved["arms"][a][0]["heldout_curve"][-1][1] for a in ("grpo_sd", "grpo")]
    assert f"GRPO + SD {finals[0]:.3f} vs GRPO {finals[1]:.3f}" in line, line
    # one start for both arms: the same warm-up model scored with the same sampling seed
    g, sd = (saved["arms"][a][0]["heldout_curve"][0] for a in ("grpo", "grpo_sd"))
    assert g == sd
    # the arms differ only in the SD term: only GRPO + SD had hinted turns distilled
    metrics = {a: (out / "runs" / f"{a}-seed0" / "metrics.jsonl").read_text() for a in ARM_NAMES}
    sd_tokens = {a: [json.loads(x).get("sd_tokens", 0) for x in m.splitlines()] for a, m in metrics.items()}
    assert not any(sd_tokens["grpo"]) and any(sd_tokens["grpo_sd"]), sd_tokens
    assert result.cpu_s > 0 and result.wall_s > 0 and result.warm_up_wall_s is not None
    assert (out / "sft-seed0" / "gap.json").is_file()  # the background warm-up's model, used by both arms


def test_rerun_reuses_finished_runs(phase) -> None:
    out, first = phase
    done = {p: p.stat().st_mtime_ns for p in out.glob("runs/*/result.json")}
    again = run_toolworld_demo(out, ToolworldDemoConfig(**TINY, workers=2), log=lambda m: None)
    assert again.rows == first.rows and len(done) == 2
    assert {p: p.stat().st_mtime_ns for p in out.glob("runs/*/result.json")} == done  # nothing retrained


def test_a_directory_of_other_settings_fails_before_any_work(phase) -> None:
    out, _ = phase
    with pytest.raises(CadenzaError, match=r"remove .*toolworld to rerun"):
        prepare(out, ToolworldDemoConfig(**{**TINY, "steps": 3}))


def test_cli_bad_toolworld_steps_is_one_line(tmp_path: Path) -> None:
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "cadenza", "demo", "--out", str(tmp_path / "d"), "--toolworld-steps", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "--toolworld-steps" in lines[0] and "--skip-toolworld" in lines[0], proc.stderr
    assert not (tmp_path / "d" / "tasks").exists() and time.time() - t0 < 60
