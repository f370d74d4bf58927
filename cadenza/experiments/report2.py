"""Study 2's analysis (pre-registered in docs/experiments.md, section 9): paired differences per seed,
the verdict rule for each claim, and the targeted measures beside the primary endpoint.

Primary endpoint: the final held-out invalid rate of each (arm, seed). For a claim "A beats B", the
per-seed differences ``d = A - B`` give a paired t 95% interval; the claim is *supported* if the
interval's upper end is below 0, *falsified* if its lower end is above ``-MARGIN`` (A is not better
than B by the margin: equal within it, or worse) and it is not supported, else *inconclusive*.
"""

from __future__ import annotations

from math import sqrt
from statistics import mean, stdev
from typing import Any

MARGIN = 0.05  # absolute held-out invalid rate (and success rate for the secondary claims)
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)  # df 1..10
CLAIMS = (
    ("sd_beats_grpo", "grpo_sd", "grpo", "SD (frozen teacher) beats GRPO"),
    ("words_beat_turn_credit", "grpo_sd", "grpo_turn", "the words add to turn-level credit"),
    ("right_words_beat_wrong", "grpo_sd", "sd_wrong_words", "the effect is the hint's content"),
    ("words_beat_no_words", "grpo_sd", "sd_no_words", "the words add to a KL to the start on those turns"),
)
DESCRIPTIVE = (("placebo", "grpo"), ("supervised", "grpo_sd"))


def paired(
    runs: dict[str, list[dict[str, Any]]], a: str, b: str, key: str, need: list[int] | None = None
) -> dict[str, Any] | None:
    """Per-seed ``a - b`` of ``key``, its mean and paired-t 95% interval; None with fewer than 2 common
    seeds, or (``need``) unless both arms finished every seed of ``need``."""
    ra, rb = ({r["seed"]: r for r in runs.get(x, [])} for x in (a, b))
    seeds = sorted(s for s in ra if s in rb and ra[s].get(key) is not None and rb[s].get(key) is not None)
    if len(seeds) < 2 or (need is not None and sorted(need) != seeds):
        return None
    d = [ra[s][key] - rb[s][key] for s in seeds]
    half = T975[min(len(d), len(T975) + 1) - 2] * stdev(d) / sqrt(len(d))
    m = mean(d)
    return {"seeds": seeds, "diffs": d, "mean": m, "ci95": [m - half, m + half]}


def verdict(p: dict[str, Any] | None, margin: float = MARGIN) -> str:
    """For "lower is better" differences A - B (see the module docstring)."""
    if p is None:
        return "not measured"
    lo, hi = p["ci95"]
    if hi < 0:
        return "supported" if hi <= -margin or lo <= -margin else "supported (by less than the margin)"
    if lo > -margin:
        return "falsified"
    return "inconclusive"


def analyse(results: dict[str, Any]) -> dict[str, Any]:
    runs = results["arms"]
    claims = {}
    for name, a, b, text in CLAIMS:
        p = paired(runs, a, b, "final_invalid_rate", need=results.get("seeds"))
        claims[name] = {"claim": text, "a": a, "b": b, "paired": p, "verdict": verdict(p)}
    targeted = {}
    for a in runs:
        if a == "grpo":
            continue
        clean = paired(runs, a, "grpo", "final_clean_success")
        succ = paired(runs, a, "grpo", "final_success")
        # "not harmed": clean-task success of A not below GRPO's by the margin (a higher-is-better measure)
        harm = None
        if clean is not None:
            lo, hi = clean["ci95"]
            harm = "not harmed" if lo > -MARGIN else "harmed" if hi < -MARGIN else "inconclusive"
        targeted[a] = {"clean_success_vs_grpo": clean, "success_vs_grpo": succ, "clean_verdict": harm}
    descriptive = {f"{a}_minus_{b}": paired(runs, a, b, "final_invalid_rate") for a, b in DESCRIPTIVE}
    return {"margin": MARGIN, "claims": claims, "targeted_vs_grpo": targeted, "descriptive": descriptive}


def _ci(p: dict[str, Any] | None) -> str:
    if p is None:
        return "-"
    return f"{p['mean']:+.3f} [{p['ci95'][0]:+.3f}, {p['ci95'][1]:+.3f}]"


def _m(runs: list[dict[str, Any]], key: str, sub: str | None = None) -> str:
    vals = [(r.get(key) or {}).get(sub, 0.0) if sub else r.get(key) for r in runs]
    vals = [v for v in vals if v is not None]
    return f"{mean(vals):.3f}" if vals else "-"


def markdown(results: dict[str, Any]) -> list[str]:
    """Study 2's verdicts and the targeted table (appended to summary.md)."""
    an = results.get("study2") or analyse(results)
    runs = results["arms"]
    lines = [
        f"## Study 2: claims (paired over seeds, primary endpoint = final held-out invalid rate, margin "
        f"{an['margin']})",
        "",
        "| claim | A - B per seed | mean [95% CI] | verdict |",
        "|---|---|---|---|",
    ]
    for c in an["claims"].values():
        p = c["paired"]
        per = ", ".join(f"{x:+.3f}" for x in p["diffs"]) if p else "-"
        lines.append(f"| {c['claim']} ({c['a']} - {c['b']}) | {per} | {_ci(p)} | **{c['verdict']}** |")
    desc = "; ".join(f"{k}: {_ci(v)}" for k, v in an["descriptive"].items())
    lines += ["", f"Descriptive (no claim): {desc}"]
    lines += [
        "",
        "## Study 2: is the change targeted? (final evaluation, mean over seeds)",
        "",
        "| arm | invalid rate (primary) | success | success on clean tasks | vs GRPO [95% CI] | invalid-args "
        "turns | no-call turns | KL to start, un-hinted turns | entropy, un-hinted turns |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for a, rs in runs.items():
        t = an["targeted_vs_grpo"].get(a, {})
        vs = _ci(t.get("clean_success_vs_grpo"))
        vs += f" ({t['clean_verdict']})" if t.get("clean_verdict") else ""
        lines.append(
            f"| {a} | {_m(rs, 'final_invalid_rate')} | {_m(rs, 'final_success')} | "
            f"{_m(rs, 'final_clean_success')} | {vs} | {_m(rs, 'final_other_errors', 'invalid_arguments')} | "
            f"{_m(rs, 'final_other_errors', 'no_call')} | {_m(rs, 'final_unhinted_kl')} | "
            f"{_m(rs, 'final_unhinted_entropy')} |"
        )
    lines += [
        "",
        "*Clean tasks*: held-out tasks whose step-0 episode had no tool-not-found error (the same tasks for "
        "every arm of a seed); *un-hinted turns*: held-out turns without a tool-not-found error; KL is "
        "exact over the vocabulary, KL(current || start model), nats per token.",
        "",
    ]
    return lines
