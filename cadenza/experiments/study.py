"""Orchestration of the tool-hint experiment: settings check, warm-up models, budget, arms in parallel,
report.

Phases (each resumable): (1) tokenizer and one SFT model + pre-RL gap per seed; (2) the ``supervised``
control for every seed until it reaches the target (or ``max_steps``): the largest of those step
counts is the budget, unless ``budget_steps`` fixes it; (3) every other arm for that many steps.
Jobs of a phase run in ``workers`` processes. ``settings.json`` pins the settings of an output
directory: rerunning with the same settings resumes, with other settings it is refused up front.
``arms`` is a selection, not a setting (no run's result depends on which other arms exist), so a later
invocation may run or report other arms of the same pinned run; the seeds are pinned (the budget is the
control's maximum over them).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from cadenza.errors import CadenzaError
from cadenza.experiments.tool_hints import ARMS, ExperimentConfig
from cadenza.jsonio import atomic_write_json, atomic_write_text


def parse_seeds(text: str) -> list[int]:
    """``"5"`` = seeds 0..4; ``"0,3,4"`` = those; ``"2-4"`` = 2, 3, 4. One-line error otherwise."""
    fix = "use a count (--seeds 5), a list (--seeds 0,3,4) or a range (--seeds 2-4)"
    t = (text or "").strip()
    try:
        if not t:
            raise ValueError
        if "," in t:
            seeds = [int(x) for x in t.split(",")]
        elif "-" in t.lstrip("-"):
            lo, hi = (int(x) for x in t.split("-"))
            seeds = list(range(lo, hi + 1))
        else:
            n = int(t)
            if n < 1:
                raise CadenzaError(f"--seeds {text!r}: need at least one seed; {fix}")
            seeds = list(range(n))
    except ValueError:
        raise CadenzaError(f"--seeds {text!r} is not a seed count, list or range; {fix}") from None
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise CadenzaError(f"--seeds {text!r}: seeds must be distinct non-negative integers; {fix}")
    return seeds


def parse_arms(text: str) -> list[str]:
    arms = [a.strip() for a in text.split(",")]
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms or len(set(arms)) != len(arms):
        raise CadenzaError(f"--arms {text!r}: unknown or repeated arm(s) {unknown}; known: {', '.join(ARMS)}")
    return [a for a in ARMS if a in arms]  # canonical order


def check_workers(workers: int) -> int:
    cores = os.cpu_count() or 1
    if not 1 <= workers <= cores:
        raise CadenzaError(f"--workers {workers}: need 1 to {cores} (this machine's cores)")
    return workers


SELECTION_KEYS = ("arms",)  # chosen per invocation; every other field is pinned by settings.json


def check_settings(out: Path, exp: ExperimentConfig) -> None:
    """Pin ``out`` to these settings, or refuse if it already holds a run with other settings."""
    if out.exists() and not out.is_dir():
        raise CadenzaError(f"--out {str(out)!r} is a file; pass a directory")
    path = out / "settings.json"
    new = dataclasses.asdict(exp)
    if path.exists():
        old = json.loads(path.read_text())
        defaults = dataclasses.asdict(type(exp)())
        for k in set(new) - set(old):  # a field added after that run: it ran with the default
            old[k] = defaults.get(k)
        keys = (set(old) | set(new)) - set(SELECTION_KEYS)
        diffs = sorted(k for k in keys if old.get(k) != new.get(k))
        if diffs:
            shown = "; ".join(f"{k}: {old.get(k)!r} there, {new.get(k)!r} now" for k in diffs[:3])
            raise CadenzaError(
                f"--out {str(out)!r} holds a run with other settings ({shown}); "
                "rerun with its settings to resume, or pass another --out"
            )
        return
    if out.is_dir() and any(out.iterdir()):
        raise CadenzaError(f"--out {str(out)!r} is not empty and holds no experiment; pass a new directory")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, new)


# ----------------------------------------------------------------- jobs (run in worker processes)


def _quiet(threads: int) -> None:
    """One job's process setup: torch threads, and no per-load progress bars in the log."""
    import torch
    from transformers.utils import logging as hf_logging

    torch.set_num_threads(threads)
    hf_logging.disable_progress_bar()


def _sft_job(exp: ExperimentConfig, out: Path, seed: int) -> dict[str, float]:
    """The warm-up model of one seed and its pre-RL gap (``gap.json`` marks it complete)."""
    from cadenza.experiments.tool_hints import measure_gap, sft_model
    from cadenza.rl.learn.sft import encode_messages
    from cadenza.rl.text.chat import load_tokenizer

    model_dir = out / f"sft-seed{seed}"
    if (model_dir / "gap.json").exists():
        return json.loads((model_dir / "gap.json").read_text())
    _quiet(exp.threads)
    tok = load_tokenizer(str(out / "tokenizer"))
    data = [encode_messages(tok, m) for m in _corpus(exp, tok)]
    sft_model(exp, seed, tok, data, model_dir, lambda m: print(m, flush=True))
    gap = measure_gap(model_dir, exp.gap_tasks, seed)
    atomic_write_json(model_dir / "gap.json", gap)
    return gap


def _arm_job(
    exp: ExperimentConfig, out: Path, arm: str, seed: int, steps: int, control: bool
) -> dict[str, Any]:
    from cadenza.experiments.arms import run_arm

    _quiet(exp.threads)
    t0 = time.time()
    res = run_arm(
        exp,
        arm,
        seed,
        out / f"sft-seed{seed}",
        out / "runs" / f"{arm}-seed{seed}",
        steps=steps,
        stop_at_target=control,
    )
    print(
        f"seed {seed} {arm}: steps {res['steps']} episodes_to_95={res['episodes_to_95']} "
        f"final_success={res['final_success']:.3f} final_invalid={res['final_invalid_rate']:.3f} "
        f"({time.time() - t0:.0f}s)",
        flush=True,
    )
    return res


def _run_arms(workers: int, jobs: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """``_arm_job`` over ``jobs``; a finished (arm, seed) is read from its ``result.json`` here, so a rerun
    starts no worker process (each costs an interpreter and a torch import) just to read a file."""
    results: list[dict[str, Any] | None] = []
    for _, out, arm, seed, *_ in jobs:
        done = out / "runs" / f"{arm}-seed{seed}" / "result.json"
        results.append(json.loads(done.read_text()) if done.exists() else None)
    todo = [j for j, r in zip(jobs, results, strict=True) if r is None]
    fresh = iter(_map(workers, _arm_job, todo))
    return [r if r is not None else next(fresh) for r in results]


def _corpus(exp: ExperimentConfig, tok: Any = None) -> list[list[dict[str, Any]]]:
    """The warm-up transcripts; with ``tok`` their placebo reminders have the hint's token length."""
    from cadenza.experiments.corpus import corpus

    if tok is None:
        return corpus(exp.corpus_seed, exp.corpus_size)
    return corpus(
        exp.corpus_seed,
        exp.corpus_size,
        placebo_length=lambda t: len(tok.encode(t, add_special_tokens=False)),
    )


def _map(workers: int, fn: Callable[..., Any], jobs: list[tuple[Any, ...]]) -> list[Any]:
    if workers == 1 or len(jobs) <= 1:
        return [fn(*j) for j in jobs]
    import multiprocessing

    from cadenza.executor.local import exit_with_parent

    with ProcessPoolExecutor(  # a SIGTERM (or SIGKILL) of this process ends the workers too
        max_workers=min(workers, len(jobs)),
        mp_context=multiprocessing.get_context("spawn"),
        initializer=exit_with_parent,
        initargs=(os.getpid(),),
    ) as ex:
        futures = [ex.submit(fn, *j) for j in jobs]
        return [f.result() for f in futures]


# ----------------------------------------------------------------- the experiment


def final_definition(exp: ExperimentConfig, budget: dict[str, Any]) -> str:
    """Where each arm's "final" numbers are taken (stated in the summary)."""
    text = f"final = the held-out evaluation at step {budget['steps']} (the budget) for every RL arm"
    if exp.control_stops_at_target:
        return text + (
            "; for the supervised control, its last evaluation: where it first reached the target "
            f"(two-evaluation average >= {exp.target}) or step {exp.max_steps}, whichever came first"
        )
    return text + " and for the supervised control (it runs the whole budget)"


def warm_up(out: Path, exp: ExperimentConfig, *, workers: int = 1) -> dict[int, dict[str, float]]:
    """Phase 1 (resumable): the tokenizer, then each seed's SFT model and its pre-RL gap. Callers pin
    ``out`` first (:func:`check_settings`); ``cadenza demo`` runs this ahead, beside its first phase."""
    from cadenza.experiments.tool_hints import build_tokenizer

    if not (out / "tokenizer" / "tokenizer_config.json").exists():
        build_tokenizer(exp, _corpus(exp), out / "tokenizer")
    gaps = {s: out / f"sft-seed{s}" / "gap.json" for s in exp.seeds}  # a finished seed: read here
    todo = [s for s in exp.seeds if not gaps[s].exists()]
    fresh = dict(zip(todo, _map(workers, _sft_job, [(exp, out, s) for s in todo]), strict=True))
    return {s: fresh[s] if s in fresh else json.loads(gaps[s].read_text()) for s in exp.seeds}


def run_experiment(
    out: str | Path,
    exp: ExperimentConfig | None = None,
    *,
    workers: int = 1,
    log: Callable[[str], None] = print,
    allow_code_change: bool = False,
) -> dict[str, Any]:
    """Run (or resume) everything and write ``results.json``, ``summary.md``, ``curves.png`` into ``out``.

    ``allow_code_change``: resume a directory that another code commit started (recorded in
    ``provenance.json`` and the results); otherwise that is refused in one line."""
    from cadenza.experiments import report
    from cadenza.experiments.provenance import Invocations, check_results, settings_digest

    exp = exp or ExperimentConfig()
    out = Path(out)
    check_workers(workers)
    check_settings(out, exp)
    calls = Invocations(out, allow_code_change=allow_code_change)
    t0, c0 = time.time(), time.process_time()
    gaps = warm_up(out, exp, workers=workers)
    for s, g in gaps.items():
        log(
            f"seed {s}: pre-RL P(valid | hint) = {g['valid_with_hint']:.3f}, P(valid | no hint) = "
            f"{g['valid_without_hint']:.3f}"
        )
    runs: dict[str, list[dict[str, Any]]] = {}
    if exp.budget_steps:
        budget = {"steps": exp.budget_steps, "source": "--budget-steps"}
    else:
        control = _run_arms(workers, [(exp, out, "supervised", s, exp.max_steps, True) for s in exp.seeds])
        runs["supervised"] = control
        steps = [r["steps_to_95"] for r in control]
        budget = {
            "steps": exp.max_steps if None in steps else max(steps),
            "source": "supervised control",
            "supervised_steps_to_95": steps,
            "control_reached_in_every_seed": None not in steps,
        }
    budget["episodes"] = budget["steps"] * exp.episodes_per_step
    atomic_write_json(out / "budget.json", budget)
    log(f"budget: {budget['steps']} steps = {budget['episodes']} episodes per run ({budget['source']})")
    todo = [a for a in exp.arms if a not in runs]
    stops = exp.control_stops_at_target
    jobs = [(exp, out, a, s, budget["steps"], stops and a == "supervised") for a in todo for s in exp.seeds]
    for (_, _, a, _, _, _), res in zip(jobs, _run_arms(workers, jobs), strict=True):
        runs.setdefault(a, []).append(res)
    digest = settings_digest(dataclasses.asdict(exp))
    check_results(runs, digest, budget["steps"], exp.control_stops_at_target)
    calls.save()
    results = {
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
        "code": calls.code,
        "code_commits": calls.commits,  # more than one only with --allow-code-change
        "invocations": calls.entries,
        "wall_s": calls.wall_s_total,  # summed over every invocation on this --out
        "wall_s_this_invocation": round(time.time() - t0, 1),
        "cpu_s_main_process": round(time.process_time() - c0, 1),
        "final_is": final_definition(exp, budget),
    }
    results["goal"] = report.goal(results)
    if report.is_study2(results):
        from cadenza.experiments import report2

        results["study2"] = report2.analyse(results)
    atomic_write_json(out / "results.json", results)
    report.plot_curves(results, out / "curves.png")
    atomic_write_text(out / "summary.md", report.summary_markdown(results))
    return results
