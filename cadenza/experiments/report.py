"""Turning per-step trainer metrics into the tool-hint experiment's results: numbers, table, plot.

Definitions (fixed before any arm was run):
- a step's *valid rate* is the trainer's ``valid_call_rate``: the fraction of that step's turns that
  call a tool the profile has (a turn with no tool call is not valid, so a policy cannot reach 95% by
  no longer calling tools);
- ``episodes_to_95``: episodes consumed up to the first step at which the mean valid rate over a
  window of ``window`` consecutive steps (that step and the ones before it) is >= 0.95 (``None``
  if never), so one lucky batch does not count;
- ``final_success`` / ``final_invalid_rate``: means over the last ``window`` steps.
"""

from __future__ import annotations

from pathlib import Path
from statistics import mean
from typing import Any

ARMS = ("grpo", "grpo_sd", "grpo_sd_topk", "placebo")
ARM_LABELS = {
    "grpo": "GRPO",
    "grpo_sd": "GRPO + SD (tool-list hint, full-vocab reverse KL)",
    "grpo_sd_topk": "GRPO + SD (tool-list hint, top-k)",
    "placebo": "GRPO + SD (placebo hint)",
}


def summarise_run(
    rows: list[dict[str, Any]], seed: int, *, target: float = 0.95, window: int = 3
) -> dict[str, Any]:
    # "invalid" = the turn did not call an existing tool (a turn without any call is not a valid call)
    curve = [[int(r["episodes"]), 1.0 - float(r["valid_call_rate"]), float(r["resolved_rate"])] for r in rows]
    episodes_to = None
    for i in range(window - 1, len(curve)):
        if mean(1.0 - c[1] for c in curve[i - window + 1 : i + 1]) >= target:
            episodes_to = curve[i][0]
            break
    tail = curve[-window:]
    return {
        "seed": seed,
        "episodes_to_95": episodes_to,
        "final_success": mean(c[2] for c in tail) if tail else 0.0,
        "final_invalid_rate": mean(c[1] for c in tail) if tail else 1.0,
        "curve": curve,
    }


def _stat(values: list[float | None], fmt: str = "{:.2f}") -> str:
    got = [v for v in values if v is not None]
    missing = len(values) - len(got)
    if not got:
        return "never" if values else "-"
    text = fmt.format(mean(got))
    if len(got) > 1:
        text += f" [{fmt.format(min(got))}, {fmt.format(max(got))}]"
    if missing:
        text += f" ({missing}/{len(values)} never)"
    return text


def summary_table(results: dict[str, Any]) -> str:
    lines = [
        "| arm | episodes to 95% valid calls | final success | final invalid-tool rate |",
        "|---|---|---|---|",
    ]
    for arm, runs in results["arms"].items():
        lines.append(
            f"| {ARM_LABELS.get(arm, arm)} | {_stat([r['episodes_to_95'] for r in runs], '{:.0f}')} | "
            f"{_stat([r['final_success'] for r in runs])} | {_stat([r['final_invalid_rate'] for r in runs], '{:.3f}')} |"
        )
    return "\n".join(lines)


def plot_curves(results: dict[str, Any], path: str | Path) -> None:
    """Mean (line) and min-max spread (band) over seeds of the valid-call and success rates per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    for arm, runs in results["arms"].items():
        if not runs:
            continue
        n = min(len(r["curve"]) for r in runs)
        x = np.array([c[0] for c in runs[0]["curve"][:n]])
        for ax, col, transform in ((axes[0], 1, lambda v: 1 - v), (axes[1], 2, lambda v: v)):
            ys = np.array([[transform(c[col]) for c in r["curve"][:n]] for r in runs])
            (line,) = ax.plot(x, ys.mean(0), label=ARM_LABELS.get(arm, arm))
            ax.fill_between(x, ys.min(0), ys.max(0), color=line.get_color(), alpha=0.15)
    axes[0].axhline(0.95, color="grey", ls=":", lw=1)
    axes[0].set(xlabel="episodes", ylabel="valid tool calls", title="Valid tool-call rate", ylim=(0, 1.02))
    axes[1].set(xlabel="episodes", ylabel="success rate", title="Episode success", ylim=(0, 1.02))
    axes[0].legend(fontsize=8, loc="lower right")
    fig.savefig(path, dpi=120)
    plt.close(fig)


def verdict(results: dict[str, Any]) -> list[str]:
    """The issue's expected outcome, checked against the numbers (mean over seeds), in plain words."""

    def mean_eps(arm: str) -> float | None:
        runs = results["arms"].get(arm) or []
        vals = [r["episodes_to_95"] for r in runs]
        if not vals or any(v is None for v in vals):
            return None
        return mean(vals)

    def mean_success(arm: str) -> float:
        return mean(r["final_success"] for r in results["arms"][arm])

    g, sd, pl = mean_eps("grpo"), mean_eps("grpo_sd"), mean_eps("placebo")
    fmt = lambda v: "never (in at least one seed)" if v is None else f"{v:.0f}"  # noqa: E731
    lines = []
    if sd is not None and (g is None or sd <= g / 3):
        lines.append(
            f"- SD needs at most a third of GRPO's episodes to 95% valid calls: **confirmed** (SD {fmt(sd)} vs GRPO {fmt(g)})."
        )
    else:
        lines.append(
            f"- SD needs at most a third of GRPO's episodes to 95% valid calls: **not confirmed** (SD {fmt(sd)} vs GRPO {fmt(g)})."
        )
    placebo_better = pl is not None and (g is None or pl < g)
    lines.append(
        f"- Placebo does no better than GRPO: **{'not confirmed' if placebo_better else 'confirmed'}** "
        f"(placebo {fmt(pl)} vs GRPO {fmt(g)} episodes)."
    )
    s_sd, s_g = mean_success("grpo_sd"), mean_success("grpo")
    lines.append(
        f"- Final success not lower with SD: **{'confirmed' if s_sd >= s_g - 0.02 else 'not confirmed'}** "
        f"(SD {s_sd:.2f} vs GRPO {s_g:.2f}; tolerance 0.02)."
    )
    return lines


def summary_markdown(results: dict[str, Any]) -> str:
    pre = results["pre_rl"]
    cfg = results.get("config", {})
    per_seed = results.get("pre_rl_per_seed", {})
    seed_gaps = ", ".join(
        f"seed {s}: {v['valid_with_hint']:.2f} vs {v['valid_without_hint']:.2f}" for s, v in per_seed.items()
    )
    parts = [
        "# Tool-hint experiment",
        "",
        f"Seeds: {', '.join(str(s) for s in results.get('seeds', []))}. "
        f"Budget per run: {cfg.get('rl_steps', '?')} steps x {cfg.get('tasks_per_step', '?')} tasks x "
        f"{cfg.get('group_size', '?')} samples = {cfg.get('rl_steps', 0) * cfg.get('tasks_per_step', 0) * cfg.get('group_size', 0)} episodes.",
        "",
        f"Pre-RL gap (SFT model, first tool call): P(valid | tool list in context) = **{pre['valid_with_hint']:.3f}**, "
        f"P(valid | no list) = **{pre['valid_without_hint']:.3f}** ({seed_gaps}).",
        "",
        "Mean over seeds, [min, max] in brackets. *Episodes to 95%*: episodes consumed when the valid-call rate, "
        f"averaged over {cfg.get('window', 3)} consecutive steps, first reaches 0.95. *Final*: mean of the last "
        f"{cfg.get('window', 3)} steps.",
        "",
        summary_table(results),
        "",
        "Expected outcome (from the issue) against these numbers:",
        "",
        *verdict(results),
        "",
        f"Wall time: {results.get('wall_s', '?')} s (CPU time {results.get('cpu_s', '?')} s). Plot: curves.png. Raw numbers: results.json.",
        "",
    ]
    return "\n".join(parts)
