"""The tool-hint experiment's results: the goal's verdicts, the table, the plot, the protocol record.

The held-out measures (``episodes_to_95``, ``final_*``, ``heldout_curve``) are defined in
docs/experiments.md, section 4, and computed in :mod:`cadenza.experiments.arms`. :func:`summarise_run`
keeps the first experiment's training-batch measure for comparison (``curve``, ``train_episodes_to_95``):
a step's valid rate is the fraction of its turns that call a tool the profile has, and the target
counts as reached when its mean over ``window`` consecutive steps is >= 0.95.
"""

from __future__ import annotations

from pathlib import Path
from statistics import mean, stdev
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cadenza.experiments.tool_hints import ExperimentConfig

ARM_LABELS = {
    "supervised": "supervised (positive control)",
    "grpo": "GRPO",
    "grpo_sd": "GRPO + SD (tool-list hint, full vocab, frozen teacher)",
    "grpo_sd_topk": "GRPO + SD (top-k, frozen teacher)",
    "placebo": "GRPO + SD (placebo hint)",
    "sd_live": "GRPO + SD (live teacher)",
    "sd_ema": "GRPO + SD (EMA teacher)",
    "sd_snapshot": "GRPO + SD (snapshot teacher)",
    "grpo_turn": "GRPO + per-turn penalty (turn credit, no words)",
    "sd_no_words": "GRPO + SD, no words (teacher context = student's)",
    "sd_wrong_words": "GRPO + SD, wrong words (another profile's tools)",
}
STUDY2_CONTROLS = ("grpo_turn", "sd_no_words", "sd_wrong_words")


def is_study2(results: dict[str, Any]) -> bool:
    """A run whose chosen arms include study 2's controls (finished or not)."""
    arms = list(results.get("config", {}).get("arms", [])) + list(results["arms"])
    return any(a in arms for a in STUDY2_CONTROLS)


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
        "| arm | held-out episodes to 95% valid calls | final held-out success | final held-out invalid "
        "rate | "
        "teacher P(correct \\| hint), first -> last |",
        "|---|---|---|---|---|",
    ]
    for arm, runs in results["arms"].items():
        probe = [r["probe_curve"] for r in runs if r.get("probe_curve")]
        drift = (
            f"{mean(p[0][1] for p in probe):.2f} -> {mean(p[-1][1] for p in probe):.2f}"
            if probe and arm != "supervised"
            else "-"
        )
        lines.append(
            f"| {ARM_LABELS.get(arm, arm)} | {_stat([r['episodes_to_95'] for r in runs], '{:.0f}')} | "
            f"{_stat([r['final_success'] for r in runs])} | "
            f"{_stat([r['final_invalid_rate'] for r in runs], '{:.3f}')} | "
            f"{drift} |"
        )
    return "\n".join(lines)


def _band(
    ax: Any, runs: list[dict[str, Any]], key: str, col: int, label: str, color: str, transform: Any = None
) -> None:
    """Mean over seeds (line) and min-max band; ``transform(value, curve)`` maps each point."""
    import numpy as np

    curves = [r[key] for r in runs if r.get(key)]
    if not curves:
        return
    n = min(len(c) for c in curves)
    x = np.array([c[0] for c in curves[0][:n]])
    # A point an arm did not measure (None: e.g. no unhinted turn at that eval) is a gap, not a zero.
    ys = np.array(
        [
            [np.nan if p[col] is None else (transform(p[col], c) if transform else p[col]) for p in c[:n]]
            for c in curves
        ],
        dtype=float,
    )
    seen = ~np.isnan(ys).all(0)
    if not seen.any():
        return
    x, ys = x[seen], ys[:, seen]
    ax.plot(x, np.nanmean(ys, 0), label=label, color=color)
    ax.fill_between(x, np.nanmin(ys, 0), np.nanmax(ys, 0), color=color, alpha=0.12)


def plot_curves(results: dict[str, Any], path: str | Path) -> None:
    """Held-out valid rate, held-out success, teacher P(correct | hint) relative to its first value:
    mean (line) and min-max band over seeds, one colour per arm in every panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kl = any(
        p[1] is not None
        for rs in results["arms"].values()
        for r in rs
        for p in r.get("heldout_kl_curve") or []
    )
    fig, axes = plt.subplots(1, 4 if kl else 3, figsize=(21 if kl else 16, 5.5), constrained_layout=True)
    colors = dict(zip(ARM_LABELS, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    for arm, runs in results["arms"].items():
        label, color = ARM_LABELS.get(arm, arm), colors.get(arm, "black")
        _band(axes[0], runs, "heldout_curve", 1, label, color, lambda v, c: 1 - v)
        _band(axes[1], runs, "heldout_curve", 2, label, color)
        if arm != "supervised":  # relative to the first value, as probe.stop_ratio reads it
            _band(axes[2], runs, "probe_curve", 1, label, color, lambda v, c: v / c[0][1] if c[0][1] else 0.0)
        if kl:  # targeted: how far the policy moved on turns the hint never touches
            _band(axes[3], runs, "heldout_kl_curve", 1, label, color)
    budget = results.get("budget", {}).get("episodes")
    for ax in axes:
        if budget:
            ax.axvline(budget, color="grey", ls="--", lw=0.8)
    axes[0].axhline(0.95, color="grey", ls=":", lw=1)
    axes[0].set(
        xlabel="training episodes",
        ylabel="valid tool calls",
        title="Held-out valid-call rate",
        ylim=(0, 1.02),
    )
    axes[1].set(xlabel="training episodes", ylabel="success rate", title="Held-out success", ylim=(0, 1.02))
    axes[2].set(
        xlabel="training episodes",
        ylabel="teacher P(correct call | hint) / first value",
        title="Teacher hint-following (probe)",
        ylim=(0, 1.1),
    )
    if kl:
        axes[3].set(
            xlabel="training episodes", ylabel="nats per token", title="Held-out KL to start, un-hinted turns"
        )
    fig.legend(*axes[0].get_legend_handles_labels(), fontsize=8, loc="outside lower center", ncol=4)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def protocol(exp: ExperimentConfig) -> dict[str, Any]:
    """The pre-registered rules as data (the text is docs/experiments.md, section 4)."""
    return {
        "document": "docs/experiments.md#4-protocol-of-the-redesigned-experiment-pre-registered",
        "scoring": f"{exp.heldout_tasks} fixed held-out tasks (seed {exp.heldout_seed}), 1 sample each, "
        f"every {exp.eval_every} steps; reached = mean valid rate of 2 consecutive evaluations >= "
        f"{exp.target}",
        "budget": "largest supervised steps-to-target over seeds (cap max_steps), unless budget_steps > 0",
        "goal": [
            "grpo_sd reaches the target in >= 4 of 5 seeds (80% of seeds) with <= 1/3 of GRPO's episodes "
            "in the same seed (GRPO never = 2 x budget)",
            "placebo within noise of GRPO: |mean final invalid difference| <= 2 Welch standard errors",
            "grpo_sd mean final success >= GRPO's - 0.05",
            "supervised reaches the target in every seed",
        ],
    }


def _sem2(a: list[float], b: list[float]) -> float | None:
    if len(a) < 2 or len(b) < 2:
        return None
    return (stdev(a) ** 2 / len(a) + stdev(b) ** 2 / len(b)) ** 0.5


def goal(results: dict[str, Any]) -> dict[str, Any]:
    """Each goal item: met (True / False / None = not measurable with these arms or seeds) and the numbers."""
    arms, budget = results["arms"], results.get("budget", {}).get("episodes")
    out: dict[str, Any] = {}
    g, sd = {r["seed"]: r for r in arms.get("grpo", [])}, {r["seed"]: r for r in arms.get("grpo_sd", [])}
    if g and sd and budget:
        ok = [
            s
            for s, r in sd.items()
            if s in g
            and r["episodes_to_95"] is not None
            and r["episodes_to_95"] <= (g[s]["episodes_to_95"] or 2 * budget) / 3
        ]
        n = len([s for s in sd if s in g])
        out["sd_third_of_grpo"] = {"met": len(ok) >= 0.8 * n, "seeds_ok": len(ok), "seeds": n}
    else:
        out["sd_third_of_grpo"] = {"met": None}
    if arms.get("placebo") and g:
        a = [r["final_invalid_rate"] for r in arms["placebo"]]
        b = [r["final_invalid_rate"] for r in g.values()]
        sem, diff = _sem2(a, b), mean(a) - mean(b)
        out["placebo_within_noise"] = {
            "met": None if sem is None else abs(diff) <= 2 * sem,
            "diff": diff,
            "two_se": None if sem is None else 2 * sem,
        }
    else:
        out["placebo_within_noise"] = {"met": None}
    if g and sd:
        d = mean(r["final_success"] for r in sd.values()) - mean(r["final_success"] for r in g.values())
        out["sd_success_not_lower"] = {"met": d >= -0.05, "diff": d}
    else:
        out["sd_success_not_lower"] = {"met": None}
    sup = arms.get("supervised", [])
    out["control_reaches_target"] = {
        "met": all(r["episodes_to_95"] is not None for r in sup) if sup else None,
        "seeds_ok": sum(r["episodes_to_95"] is not None for r in sup),
        "seeds": len(sup),
    }
    return out


def _word(met: bool | None) -> str:
    return "**met**" if met else "not measured (arm or seeds missing)" if met is None else "**not met**"


def verdict(results: dict[str, Any]) -> list[str]:
    gl = results.get("goal") or goal(results)
    a, p, s, c = (
        gl[k]
        for k in (
            "sd_third_of_grpo",
            "placebo_within_noise",
            "sd_success_not_lower",
            "control_reaches_target",
        )
    )
    return [
        "1. SD reaches 95% held-out valid calls in >= 80% of seeds with <= 1/3 of GRPO's episodes: "
        f"{_word(a['met'])}" + (f" ({a['seeds_ok']}/{a['seeds']} seeds)" if a["met"] is not None else ""),
        f"2. Placebo within noise of GRPO (final invalid rate): {_word(p['met'])}"
        + (f" (difference {p['diff']:+.3f}, 2 SE {p['two_se']:.3f})" if p["met"] is not None else ""),
        f"3. SD's final success not below GRPO's by more than 0.05: {_word(s['met'])}"
        + (f" (difference {s['diff']:+.3f})" if s["met"] is not None else ""),
        f"4. The supervised control reaches 95% in every seed: {_word(c['met'])}"
        + (f" ({c['seeds_ok']}/{c['seeds']} seeds)" if c["met"] is not None else ""),
    ]


def summary_markdown(results: dict[str, Any]) -> str:
    pre, cfg, budget = results["pre_rl"], results.get("config", {}), results.get("budget", {})
    per_seed = results.get("pre_rl_per_seed", {})
    seed_gaps = ", ".join(
        f"seed {s}: {v['valid_with_hint']:.2f} vs {v['valid_without_hint']:.2f}" for s, v in per_seed.items()
    )
    quick = cfg.get("max_steps", 0) < 20
    return "\n".join(
        [
            "# Tool-hint experiment",
            "",
            *(
                [
                    "**Smoke-test scale (--quick or a small slice): these numbers say nothing about the "
                    "arms.**",
                    "",
                ]
                if quick
                else []
            ),
            f"Seeds: {', '.join(str(s) for s in results.get('seeds', []))}. Budget per run: "
            f"{budget.get('steps', '?')} steps "
            f"x {cfg.get('tasks_per_step', '?')} tasks x {cfg.get('group_size', '?')} samples = "
            f"{budget.get('episodes', '?')} "
            f"episodes ({budget.get('source', '?')}). Protocol: docs/experiments.md, section "
            f"{'9' if is_study2(results) else '4'}.",
            "",
            "Pre-RL gap (SFT model, first tool call): P(valid | tool list in context) = "
            f"**{pre['valid_with_hint']:.3f}**, "
            f"P(valid | no list) = **{pre['valid_without_hint']:.3f}** ({seed_gaps}).",
            "",
            f"Mean over seeds, [min, max] in brackets. Held-out: {cfg.get('heldout_tasks', '?')} fixed "
            "tasks scored every "
            f"{cfg.get('eval_every', '?')} steps; *episodes to 95%*: training episodes when the held-out "
            "valid rate, averaged "
            "with the previous evaluation, first reaches 0.95. *Final*: the last evaluation ("
            f"{results.get('final_is', 'the last evaluation of each run')}).",
            "",
            summary_table(results),
            "",
            *(_study2(results) if is_study2(results) else _goal(results)),
            _provenance(results),
            "",
        ]
    )


def _goal(results: dict[str, Any]) -> list[str]:
    return ["Goal (from the issue) against these numbers:", "", *verdict(results), ""]


def _study2(results: dict[str, Any]) -> list[str]:
    from cadenza.experiments import report2

    return report2.markdown(results)


def _provenance(results: dict[str, Any]) -> str:
    code = results.get("code") or {}
    commits = results.get("code_commits") or []
    mixed = f" **Mixed code versions: {', '.join(c[:10] for c in commits)}.**" if len(commits) > 1 else ""
    return (
        f"Code: {code.get('commit', '?')[:12]}{' (dirty tree)' if code.get('dirty') else ''}; settings "
        f"digest {results.get('settings_digest', '?')}.{mixed} Wall time: {results.get('wall_s', '?')} s "
        f"over {len(results.get('invocations', [])) or '?'} invocation(s). Plot: curves.png. Raw numbers: "
        "results.json."
    )
