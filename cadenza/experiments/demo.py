"""The tool-hint phase of ``cadenza demo``: GRPO and GRPO + SD side by side, scored on held-out tasks.

Why: the demo's real-task phase runs every stage for real, but its tiny policy solves nothing there, so
nothing visibly learns. In toolworld (docs/experiments.md, section 4) the text feedback is the one
difference between two arms: both start from the same warm-up model with the same seed, tasks and
sampling seeds; only GRPO + SD distils from the tool-list hint (frozen teacher). This module only sizes
the experiment and draws its outcome; the runner is :func:`cadenza.experiments.study.run_experiment`,
unchanged (tokenizer, SFT warm-up and its pre-RL gap, the two arms in parallel processes, the fixed
held-out set scored every ``eval_every`` steps). Every number shown is read from its ``results.json``.
"""

from __future__ import annotations

import json
import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from cadenza.errors import CadenzaError
from cadenza.experiments.tool_hints import ExperimentConfig

DEMO_ARMS = ("grpo", "grpo_sd")
ARM_NAMES = {"grpo": "GRPO", "grpo_sd": "GRPO + SD (tool-list hint)"}


@dataclass(kw_only=True)
class ToolworldDemoConfig:
    """The phase's size: fixed in advance from measured CPU time (docs/curriculum.md), never tuned to a
    result. Everything else is the tool-hint experiment's pre-registered default."""

    seed: int = 0  # the one seed of the warm-up model and both arms (fixed before any run)
    steps: int = 20  # RL steps per arm (4 tasks x 8 samples = 32 episodes a step)
    eval_every: int = 5  # held-out scoring every K steps (and at step 0)
    heldout_tasks: int = 32  # fixed held-out toolworld tasks, one sample each, the same for both arms
    sft_steps: int = 200  # warm-up SFT steps (the study's 400 halved; the pre-RL gap is printed)
    corpus_size: int = 1000  # warm-up transcripts
    gap_tasks: int = 64  # tasks of the pre-RL gap measure (first call with vs without the tool list)
    probe_items: int = 8  # hint-following probe items (logged in each arm's metrics.jsonl)
    workers: int = 2  # processes: the two arms run side by side

    def __post_init__(self) -> None:
        if min(self.steps, self.eval_every, self.heldout_tasks, self.sft_steps, self.gap_tasks) < 1:
            raise CadenzaError(
                "the toolworld phase needs --toolworld-steps and its sizes >= 1; "
                "pass --skip-toolworld to leave the phase out"
            )
        if self.corpus_size < 16 or self.probe_items < 1 or self.workers < 1:
            raise CadenzaError("the toolworld phase needs corpus_size >= 16, probe_items >= 1, workers >= 1")

    def experiment(self) -> ExperimentConfig:
        """The study's config with this phase's sizes (budget fixed: no supervised control runs)."""
        return ExperimentConfig(
            seeds=[self.seed],
            arms=list(DEMO_ARMS),
            corpus_size=self.corpus_size,
            sft_steps=self.sft_steps,
            gap_tasks=self.gap_tasks,
            budget_steps=self.steps,
            max_steps=self.steps,
            eval_every=self.eval_every,
            heldout_tasks=self.heldout_tasks,
            probe_items=self.probe_items,
        )


class ToolworldDemoResult(NamedTuple):
    """The study's results (``results.json``), one summary row per arm, the plot, and the phase's cost."""

    results: dict[str, Any]
    rows: list[dict[str, Any]]
    plot: Path
    wall_s: float  # after the real-task phase: the arms (and the warm-up if it had not finished)
    cpu_s: float  # the whole phase: the warm-up process, this process and the arms' worker processes
    warm_up_wall_s: float | None  # the warm-up process, beside the real-task phase (None: none started)
    load: tuple[float, float, float]  # load average at the end of the phase


def prepare(out: Path, cfg: ToolworldDemoConfig) -> None:
    """Pin (or check) the phase's directory before any long work: a directory made with other settings
    fails here, in the first second, not after the real-task phase."""
    from cadenza.experiments.study import check_settings, check_workers

    check_workers(min(cfg.workers, os.cpu_count() or 1))
    try:
        check_settings(out, cfg.experiment())
    except CadenzaError as e:
        raise CadenzaError(f"{e} (the demo's toolworld phase: remove {out} to rerun it)") from None


def _cpu_s(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def _warm_up_main(parent: int, out: Path, cfg: ToolworldDemoConfig) -> None:
    """The runner's warm-up phase in a process of its own; its output goes to ``warm_up.log``."""
    import contextlib

    from cadenza.executor.local import exit_with_parent
    from cadenza.experiments.study import warm_up
    from cadenza.jsonio import atomic_write_json

    exit_with_parent(parent)
    t0 = time.time()
    with open(out / "warm_up.log", "a") as f, contextlib.redirect_stdout(f):
        warm_up(out, cfg.experiment())
    cost = {"wall_s": round(time.time() - t0, 1), "cpu_s": round(_cpu_s(resource.RUSAGE_SELF), 1)}
    atomic_write_json(out / "warm_up_cost.json", cost)


def start_warm_up(out: Path, cfg: ToolworldDemoConfig) -> Any:
    """Start the warm-up (tokenizer, SFT model, pre-RL gap) in a background process, so that it runs on
    the core the task build leaves idle; :func:`run_toolworld_demo` waits for it."""
    import multiprocessing

    prepare(out, cfg)
    (out / "warm_up_cost.json").unlink(missing_ok=True)
    proc = multiprocessing.get_context("spawn").Process(
        target=_warm_up_main, args=(os.getpid(), out, cfg), name="cadenza-demo-warm-up", daemon=True
    )
    proc.start()
    return proc


def _join_warm_up(proc: Any, out: Path, log: Any, timeout_s: float) -> tuple[float, float] | None:
    """Wait for the background warm-up; (wall, CPU) of it, or None when it failed (the runner then redoes
    whatever it left unfinished, in this process)."""
    proc.join(timeout_s)
    if proc.is_alive():
        proc.terminate()
        proc.join(10)
        log(f"toolworld: the background warm-up took over {timeout_s:.0f} s; finishing it here")
        return None
    cost = out / "warm_up_cost.json"
    if proc.exitcode != 0 or not cost.exists():
        log(
            f"toolworld: the background warm-up failed (exit {proc.exitcode}, see {out / 'warm_up.log'}); "
            "retrying here"
        )
        return None
    c = json.loads(cost.read_text())
    return c["wall_s"], c["cpu_s"]


def run_toolworld_demo(
    out: Path,
    cfg: ToolworldDemoConfig,
    log: Any = print,
    warm_up: Any = None,
    warm_up_timeout_s: float = 1800,
) -> ToolworldDemoResult:
    """Warm-up model and its gap (``warm_up``: the process :func:`start_warm_up` started), both arms from it,
    held-out curves; the plot goes beside ``out``."""
    from cadenza.experiments.study import run_experiment

    prepare(out, cfg)
    t0 = time.time()
    c0 = _cpu_s(resource.RUSAGE_SELF) + _cpu_s(resource.RUSAGE_CHILDREN)
    background = _join_warm_up(warm_up, out, log, warm_up_timeout_s) if warm_up is not None else None
    c1 = _cpu_s(resource.RUSAGE_SELF) + _cpu_s(resource.RUSAGE_CHILDREN)  # less the warm-up's, counted below
    log(
        f"toolworld: GRPO and GRPO + SD for {cfg.steps} steps each from one warm-up model (seed {cfg.seed}), "
        f"held-out scoring every {cfg.eval_every} steps on {cfg.heldout_tasks} tasks"
    )
    results = run_experiment(
        out,
        cfg.experiment(),
        workers=min(cfg.workers, os.cpu_count() or 1),
        log=log,
        allow_code_change=True,  # a rerun after an update reuses finished runs; the commits are recorded
    )
    cpu = _cpu_s(resource.RUSAGE_SELF) + _cpu_s(resource.RUSAGE_CHILDREN) - c1
    if background is None:
        cpu += c1 - c0
    rows = arm_rows(results)
    plot = plot_heldout(results, out.parent / "toolworld_heldout.png")
    return ToolworldDemoResult(
        results=results,
        rows=rows,
        plot=plot,
        wall_s=round(time.time() - t0, 1),
        cpu_s=round(cpu + (background[1] if background else 0.0), 1),
        warm_up_wall_s=background[0] if background else None,
        load=os.getloadavg(),
    )


def arm_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Per arm: held-out invalid-call and success rates at step 0 and at the last evaluation."""
    rows = []
    for arm in DEMO_ARMS:
        (run,) = results["arms"][arm]  # one seed
        curve = run["heldout_curve"]  # [episodes, invalid rate, success rate] per evaluation
        rows.append(
            {
                "arm": arm,
                "steps": run["steps"],
                "episodes": curve[-1][0],
                "start_invalid": curve[0][1],
                "final_invalid": curve[-1][1],
                "start_success": curve[0][2],
                "final_success": curve[-1][2],
                "wall_s": run["wall_s"],
            }
        )
    return rows


def plot_heldout(results: dict[str, Any], path: Path) -> Path:
    """Held-out invalid-call rate and success against training steps, one line per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per_step = results["config"]["tasks_per_step"] * results["config"]["group_size"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    for arm in DEMO_ARMS:
        (run,) = results["arms"][arm]
        steps = [e / per_step for e, _, _ in run["heldout_curve"]]
        for ax, k in zip(axes, (1, 2), strict=True):
            ax.plot(steps, [c[k] for c in run["heldout_curve"]], marker="o", label=ARM_NAMES[arm])
    cfg = results["config"]
    where = f"{cfg['heldout_tasks']} held-out tasks, seed {results['seeds'][0]}"
    axes[0].set(
        xlabel="RL step", ylabel="invalid tool calls / turns", title=f"Held-out invalid-call rate ({where})"
    )
    axes[1].set(xlabel="RL step", ylabel="episodes solved", title="Held-out success")
    for ax in axes:
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0].legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def toolworld_table(result: ToolworldDemoResult) -> Any:
    """The closing table: per arm, held-out invalid-call rate and success from start to final."""
    from rich.table import Table

    res = result.results
    gap = res["pre_rl"]
    commits = ", ".join(c[:10] for c in res.get("code_commits", [])) or "?"
    table = Table(
        title="cadenza demo: toolworld, GRPO vs GRPO + SD (same start, seed, tasks and budget)",
        caption=(
            f"held-out: {res['config']['heldout_tasks']} fixed tasks, one sample each, as measured (seed "
            f"{res['seeds'][0]}, code {commits}). Pre-RL gap of the warm-up model: P(valid first call | "
            f"tool list) {gap['valid_with_hint']:.2f} vs {gap['valid_without_hint']:.2f} without"
        ),
    )
    for name in (
        "arm",
        "steps",
        "episodes",
        "invalid start",
        "invalid final",
        "success start",
        "success final",
    ):
        table.add_column(name, justify="left" if name == "arm" else "right")
    for r in result.rows:
        table.add_row(
            ARM_NAMES[r["arm"]],
            str(r["steps"]),
            str(r["episodes"]),
            f"{r['start_invalid']:.3f}",
            f"{r['final_invalid']:.3f}",
            f"{r['start_success']:.3f}",
            f"{r['final_success']:.3f}",
        )
    return table


def cost_line(result: ToolworldDemoResult) -> str:
    load = ", ".join(f"{x:.1f}" for x in result.load)
    return (
        f"toolworld phase: {result.wall_s:.0f} s wall, {result.cpu_s:.0f} CPU-s (this process and its "
        f"workers), load average {load}; plot: {result.plot}"
    )


def outcome_line(result: ToolworldDemoResult) -> str:
    """The comparison in words, computed from the rows (whichever way it came out)."""
    g, sd = ({r["arm"]: r for r in result.rows}[a] for a in DEMO_ARMS)
    d = sd["final_invalid"] - g["final_invalid"]
    who = ("lower" if d < 0 else "higher") + f" by {abs(d):.3f}" if d else "the same"
    return (
        f"at step {sd['steps']}: held-out invalid-call rate GRPO + SD {sd['final_invalid']:.3f} vs GRPO "
        f"{g['final_invalid']:.3f} (SD {who}; both {g['start_invalid']:.3f} at "
        f"step 0), success {sd['final_success']:.3f} vs {g['final_success']:.3f}. One seed at toy scale: an "
        "illustration, not a result (docs/experiments.md, sections 6 and 9, has the multi-seed studies)."
    )
