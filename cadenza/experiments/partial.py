"""Report what an interrupted run finished, and name what it did not (``--report-only``).

A run stopped at a point its protocol fixes (e.g. a deadline) is reported from the (arm, seed) runs that
wrote ``result.json``; every other one is named in one line (the step its last held-out evaluation
reached, or "not started") and left out: no partial curve is used as a final. ``results.json`` then
says ``"complete": false`` and lists them under ``interrupted``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cadenza.errors import CadenzaError
from cadenza.jsonio import atomic_write_json, atomic_write_text

if TYPE_CHECKING:
    from cadenza.experiments.tool_hints import ExperimentConfig


def _latest_mtime(out: Path) -> float:
    return max((p.stat().st_mtime for p in out.rglob("*") if p.is_file()), default=0.0)


def report_only(out: str | Path, exp: ExperimentConfig, log: Any = print) -> dict[str, Any]:
    """``results.json``, ``summary.md`` and ``curves.png`` of what ``out`` holds, without training."""
    from cadenza.experiments import report
    from cadenza.experiments.provenance import check_results, code_version, settings_digest
    from cadenza.experiments.study import check_settings, final_definition
    from cadenza.experiments.tool_hints import ARMS

    out = Path(out)
    if not (out / "settings.json").exists():
        raise CadenzaError(f"--out {str(out)!r} holds no experiment to report; run it first")
    check_settings(out, exp)
    budget_path = out / "budget.json"
    if not budget_path.exists():
        raise CadenzaError(f"--out {str(out)!r} stopped before its budget was fixed: nothing to report")
    budget = json.loads(budget_path.read_text())
    gaps = {s: json.loads((out / f"sft-seed{s}" / "gap.json").read_text()) for s in exp.seeds}
    runs: dict[str, list[dict[str, Any]]] = {}
    interrupted = []
    for a in exp.arms:
        for s in exp.seeds:
            d = out / "runs" / f"{a}-seed{s}"
            if (d / "result.json").exists():
                runs.setdefault(a, []).append(json.loads((d / "result.json").read_text()))
                continue
            evals = (d / "heldout.jsonl").read_text().splitlines() if (d / "heldout.jsonl").exists() else []
            at = f"at step {json.loads(evals[-1])['step']} of {budget['steps']}" if evals else "not started"
            interrupted.append(f"{a} seed {s}: interrupted ({at}); left out")
    for line in interrupted:
        log(line)
    digest = settings_digest(dataclasses.asdict(exp))
    check_results(runs, digest, budget["steps"], exp.control_stops_at_target)
    prov = json.loads((out / "provenance.json").read_text())["invocations"]
    for e in prov:  # an invocation stopped by a signal never wrote its wall time: from its files
        if not e["wall_s"]:
            e["wall_s"], e["wall_s_from_files"] = round(_latest_mtime(out) - e["started"], 1), True
    results = {
        "complete": not interrupted,
        "interrupted": interrupted,
        "pre_rl": {
            k: sum(g[k] for g in gaps.values()) / len(gaps) for k in ("valid_with_hint", "valid_without_hint")
        },
        "arms": {a: runs[a] for a in ARMS if a in runs},
        "seeds": list(exp.seeds),
        "pre_rl_per_seed": {str(k): v for k, v in gaps.items()},
        "budget": budget,
        "protocol": report.protocol(exp),
        "config": dataclasses.asdict(exp),
        "settings_digest": digest,
        "code": prov[-1]["code"],  # the code that trained (this report ran under code_version below)
        "report_code": code_version(),
        "code_commits": sorted({e["code"]["commit"] for e in prov}),
        "invocations": prov,
        "wall_s": round(sum(e["wall_s"] for e in prov), 1),
        "reported_at": round(time.time(), 1),
        "final_is": final_definition(exp, budget),
    }
    results["goal"] = report.goal(results)
    if report.is_study2(results):
        from cadenza.experiments import report2

        results["study2"] = report2.analyse(results)
    atomic_write_json(out / "results.json", results)
    report.plot_curves(results, out / "curves.png")
    text = report.summary_markdown(results)
    if interrupted:
        text = text.replace("\n\n", "\n\n**Interrupted (left out):** " + "; ".join(interrupted) + "\n\n", 1)
    atomic_write_text(out / "summary.md", text)
    return results
