"""The tool-hint experiment's second setting: a real pretrained model, SmolLM2-135M-Instruct, no SFT.

The profile's real tool schemas go into the system message in SmolLM2's function-calling prompt format
(its chat template renders no ``tools=``); each assistant turn starts with ``<tool_call>[{"name": "``
(``rollout.response_prefix``: a forced call, as ``tool_choice="required"`` does), so the model chooses
the name itself and tool-name errors arise naturally (``read_file`` where the profile says ``view``).
The hint is the same ``tool_not_found`` tool list. Phases, each resumable: the pre-RL gap
(:func:`cadenza.experiments.tool_hints.measure_gap`), then every (arm, seed) for a fixed, pre-registered
number of steps through the shared runner (:func:`cadenza.experiments.arms.run_arm`): the ordinary
trainer with only the last ``trainable_layers`` decoder layers training, scored on a fixed held-out set
every ``eval_every`` steps. Protocol: docs/experiments.md, section 5.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean
from typing import Any

from cadenza.errors import CadenzaError
from cadenza.experiments.toolworld import CALL_OPEN, ToolworldConfig
from cadenza.jsonio import atomic_write_json, atomic_write_text

SMOL_ARMS = ("grpo", "grpo_turn", "grpo_sd", "placebo")  # grpo_turn: turn-level credit, no words
ROUND1_ARMS = ("grpo", "grpo_sd", "placebo")  # section 5's arms: the default (round 2 passes --arms)
# --quick: 1 seed, one step of 1 task x 2 samples, 2 held-out tasks, a 2-task gap (each gap task is two
# ~600-token prompts through SmolLM2: the gap was a quarter of the smoke test's CPU time with 4 tasks)
QUICK: dict[str, Any] = {
    "seeds": [0],
    "gap_tasks": 2,
    "steps": 1,
    "eval_every": 1,
    "heldout_tasks": 2,
    "probe_items": 1,
    "tasks_per_step": 1,
    "group_size": 2,
}


@dataclass(kw_only=True)
class SmolConfig:
    """Pre-registered in docs/experiments.md, section 5; ``--quick`` only shrinks seeds, sizes and steps."""

    seeds: list[int] = field(default_factory=lambda: [0, 1])
    arms: list[str] = field(default_factory=lambda: list(ROUND1_ARMS))
    model: str = "smollm2"  # "smollm2" (offline SmolLM2-135M-Instruct) or a local HF directory
    device: str = "cpu"  # "cuda" on a GPU machine (bench/gpu_smol_tools.sh)
    trainable_layers: int = 4  # only the last N of the 30 decoder layers (and the final norm) train; 0 = all
    gap_tasks: int = 128  # tasks of the pre-RL gap (each sampled with and without the hint)
    steps: int = 6  # RL steps of every (arm, seed): fixed before running (no control arm here)
    tasks_per_step: int = 2
    group_size: int = 4
    rl_lr: float = 2e-4
    lambda_sd: float = 1.0
    top_k: int = 8  # unused by these arms (full-vocabulary SD); kept for the shared train_config
    temperature: float = 1.0
    max_new_tokens: int = 24  # a call after the forced prefix is ~15 tokens
    eval_every: int = 3  # held-out scoring (and the hint-following diagnostic) every K steps
    heldout_tasks: int = 32  # fixed held-out tasks, identical for all arms and seeds
    heldout_seed: int = 777
    target: float = 0.95  # held-out valid-call rate that counts as "reached"
    probe_items: int = 4  # 4 passes of ~340 tokens each per item: the probe is costly on a CPU
    ema_decay: float = 0.99  # unused by these arms (frozen teacher); kept for the shared train_config
    refresh_every: int = 10  # likewise
    window: int = 3  # training-batch curve window (kept for comparison, as in tool-hints)
    threads: int = 1  # torch threads per process (a shared CPU: one thread per worker)
    min_steps: int = 1  # operations per task: one call per episode
    max_steps: int = 1
    extra_turns: int = 0  # no second try: the erring turn is the episode's only turn
    turn_penalty: float = 1.0  # the grpo_turn arm's advantage penalty on an invalid-call turn

    @classmethod
    def quick(cls) -> SmolConfig:
        """A smoke test of the whole pipeline: it says nothing about the arms."""
        return cls(**copy.deepcopy(QUICK))

    @property
    def episodes_per_step(self) -> int:
        return self.tasks_per_step * self.group_size

    @property
    def toolworld(self) -> ToolworldConfig:
        return ToolworldConfig(
            min_steps=self.min_steps,
            max_steps=self.max_steps,
            extra_turns=self.extra_turns,
            tools_prompt="system",
        )

    @property
    def response_prefix(self) -> str:
        return CALL_OPEN

    def train_config(self, arm: str, seed: int, model_dir: Path, out_dir: Path, steps: int) -> Any:
        """The tool-hint experiment's trainer config for this arm, with this setting's env, prefix and
        trainable layers."""
        from cadenza.experiments.tool_hints import train_config

        cfg = train_config(self, arm, seed, model_dir, out_dir, steps)  # type: ignore[arg-type]
        cfg.env.options = dataclasses.asdict(self.toolworld)
        cfg.rollout.max_turns = self.max_steps + self.extra_turns
        cfg.rollout.response_prefix = self.response_prefix
        cfg.model.trainable_layers = self.trainable_layers
        cfg.model.device = self.device
        cfg.run.measure_kl = False  # one forward less per step on a CPU budget
        return cfg


def check_arms(arms: list[str]) -> list[str]:
    unknown = [a for a in arms if a not in SMOL_ARMS]
    if unknown or not arms or len(set(arms)) != len(arms):
        raise CadenzaError(
            f"--arms {','.join(arms)!r}: unknown or repeated arm(s) {unknown}; known: {', '.join(SMOL_ARMS)}"
        )
    return [a for a in SMOL_ARMS if a in arms]


def _model_dir(exp: SmolConfig) -> Path:
    from cadenza.rl.models import resolve_model

    path = Path(resolve_model(exp.model)).expanduser()
    if not (path / "config.json").is_file():
        raise CadenzaError(
            f"--model {exp.model!r}: no HF model directory there; use smollm2 or a local HF directory"
        )
    return path


def _gap_job(exp: SmolConfig, out: Path) -> dict[str, Any]:
    from cadenza.experiments.study import _quiet
    from cadenza.experiments.tool_hints import measure_gap

    path = out / "gap.json"
    if path.exists():
        return json.loads(path.read_text())
    _quiet(exp.threads)
    c0 = time.process_time()
    gap = measure_gap(
        _model_dir(exp),
        exp.gap_tasks,
        0,
        config=exp.toolworld,
        prefix=exp.response_prefix,
        max_new_tokens=exp.max_new_tokens,
        details=True,
        batch=16,
        device=exp.device,
    )
    gap["cpu_s"] = round(time.process_time() - c0, 1)
    atomic_write_json(path, gap)
    return gap


def _step0_job(exp: SmolConfig, out: Path) -> dict[str, Any]:
    """The held-out score of the untrained model: identical for every (arm, seed) (same weights, tasks and
    sampling seed), so it is computed once and seeded into each run's ``heldout.jsonl``."""
    from cadenza.experiments.heldout import evaluate, heldout_tasks
    from cadenza.experiments.study import _quiet
    from cadenza.rl.engines.policy import HFPolicy
    from cadenza.rl.text.chat import load_tokenizer

    path = out / "step0.json"
    if path.exists():
        return json.loads(path.read_text())
    _quiet(exp.threads)
    model_dir = _model_dir(exp)
    tasks = heldout_tasks(exp.heldout_tasks, exp.heldout_seed, exp.toolworld)
    policy = HFPolicy.from_pretrained(model_dir, device=exp.device)
    row = {
        "step": 0,
        "episodes": 0,
        **evaluate(policy, load_tokenizer(str(model_dir)), tasks, exp.heldout_seed, exp),
    }
    atomic_write_json(path, row)
    return row


def _arm_job(exp: SmolConfig, out: Path, arm: str, seed: int) -> dict[str, Any]:
    from cadenza.experiments.arms import run_arm
    from cadenza.experiments.study import _quiet

    _quiet(exp.threads)
    c0, t0 = time.process_time(), time.time()
    run_dir = out / "runs" / f"{arm}-seed{seed}"
    fresh = not (run_dir / "result.json").exists()
    if not (run_dir / "heldout.jsonl").exists():
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(run_dir / "heldout.jsonl", json.dumps(_step0_job(exp, out)) + "\n")
    res = run_arm(exp, arm, seed, _model_dir(exp), run_dir, steps=exp.steps)
    if fresh:  # this process's CPU for the (arm, seed) (after an interruption: the resumed part only)
        res["cpu_s"] = round(time.process_time() - c0, 1)
        res["wall_s"] = round(time.time() - t0, 1)
        atomic_write_json(run_dir / "result.json", res)
    print(
        f"seed {seed} {arm}: final_invalid={res['final_invalid_rate']:.3f} "
        f"final_success={res['final_success']:.3f} (cpu {res.get('cpu_s', '?')} s)",
        flush=True,
    )
    return res


def _job(kind: str, *args: Any) -> dict[str, Any]:
    """One pool job: the gap runs alongside the arms (it does not feed them)."""
    return _gap_job(*args) if kind == "gap" else _arm_job(*args)


def run_smol(
    out: str | Path,
    exp: SmolConfig | None = None,
    *,
    workers: int = 1,
    log: Callable[[str], None] = print,
    allow_code_change: bool = False,
) -> dict[str, Any]:
    """Run (or resume) the setting and write ``results.json``, ``summary.md``, ``curves.png`` into ``out``."""
    from cadenza.experiments import report
    from cadenza.experiments.study import _map, check_settings, check_workers

    exp = exp or SmolConfig()
    out = Path(out)
    check_workers(workers)
    check_arms(exp.arms)
    if exp.steps < 1 or exp.eval_every < 1:
        raise CadenzaError("--steps and eval_every must be >= 1")
    _model_dir(exp)  # a missing model is one line before any work
    check_settings(out, exp)  # type: ignore[arg-type]
    from cadenza.experiments.provenance import Invocations, check_results, settings_digest

    calls = Invocations(out, allow_code_change=allow_code_change)
    t0 = time.time()
    step0 = _step0_job(exp, out)
    log(f"untrained model, held-out valid-call rate: {step0['valid_call_rate']:.3f}")
    jobs = [(exp, out, a, s) for a in exp.arms for s in exp.seeds]
    done = _map(workers, _job, [("gap", exp, out), *(("arm", *j) for j in jobs)])
    gap = done[0]
    log(
        f"pre-RL gap ({exp.gap_tasks} tasks): P(valid first call | hint) = {gap['valid_with_hint']:.3f}, "
        f"without = {gap['valid_without_hint']:.3f}"
    )
    runs: dict[str, list[dict[str, Any]]] = {}
    for (_, _, a, _), res in zip(jobs, done[1:], strict=True):
        runs.setdefault(a, []).append(res)
    digest = settings_digest(dataclasses.asdict(exp))
    check_results(runs, digest, exp.steps, control_stops=False)
    calls.save()
    results = {
        "pre_rl": gap,
        "arms": runs,
        "seeds": list(exp.seeds),
        "budget": {
            "steps": exp.steps,
            "episodes": exp.steps * exp.episodes_per_step,
            "source": "pre-registered",
        },
        "protocol": protocol(exp),
        "config": dataclasses.asdict(exp),
        "cpu_s": {
            "gap": gap.get("cpu_s"),
            **{f"{a}-seed{r['seed']}": r.get("cpu_s") for a in runs for r in runs[a]},
        },
        "settings_digest": digest,
        "code": calls.code,
        "code_commits": calls.commits,
        "invocations": calls.entries,
        "wall_s": calls.wall_s_total,  # summed over every invocation on this --out
        "wall_s_this_invocation": round(time.time() - t0, 1),
        "final_is": f"final = the held-out evaluation at step {exp.steps} (the fixed budget) for every arm",
    }
    results["comparison"] = compare(results)
    atomic_write_json(out / "results.json", results)
    report.plot_curves(results, out / "curves.png")
    atomic_write_text(out / "summary.md", summary_markdown(results))
    return results


def protocol(exp: SmolConfig) -> dict[str, Any]:
    return {
        "document": "docs/experiments.md#5-a-second-setting-a-real-pretrained-model",
        "gap": f"P(valid first call | tool-list hint) vs without, {exp.gap_tasks} tasks, temperature 1",
        "scoring": f"{exp.heldout_tasks} fixed held-out tasks (seed {exp.heldout_seed}), 1 sample each, "
        f"every {exp.eval_every} steps; valid = the call names a tool of the profile",
        "budget": f"{exp.steps} steps x {exp.episodes_per_step} episodes per (arm, seed), fixed in advance",
        "reading": "grpo_sd vs grpo: difference of mean final held-out invalid rates; a direction only if "
        "same sign in every seed and > 0.15; placebo is the control for any extra text",
    }


def compare(results: dict[str, Any]) -> dict[str, Any]:
    """Mean final held-out invalid rate per arm, its change from step 0, and SD - GRPO / placebo - GRPO."""
    arms = results["arms"]
    per = {
        a: {
            "final_invalid_mean": mean(r["final_invalid_rate"] for r in runs),
            "change_mean": mean(r["final_invalid_rate"] - r["heldout_curve"][0][1] for r in runs),
            "final_invalid_per_seed": [r["final_invalid_rate"] for r in runs],
        }
        for a, runs in arms.items()
    }
    out: dict[str, Any] = {"arms": per}
    for a in ("grpo_sd", "placebo"):
        if a in per and "grpo" in per:
            out[f"{a}_minus_grpo"] = per[a]["final_invalid_mean"] - per["grpo"]["final_invalid_mean"]
    return out


def summary_markdown(results: dict[str, Any]) -> str:
    from cadenza.experiments.report import summary_table

    pre, cfg, cmp = results["pre_rl"], results["config"], results["comparison"]
    gap = pre["valid_with_hint"] - pre["valid_without_hint"]
    quick = cfg["steps"] < 5
    lines = [
        "# Tool hints on a real pretrained model (SmolLM2-135M-Instruct)",
        "",
        *(
            ["**Smoke-test scale (under 5 steps): these numbers say nothing about the arms.**", ""]
            if quick
            else []
        ),
        f"Seeds: {', '.join(map(str, results['seeds']))}. {cfg['steps']} steps x {cfg['tasks_per_step']} "
        f"tasks x {cfg['group_size']} samples per run; last {cfg['trainable_layers']} decoder layers "
        f"trainable; lr {cfg['rl_lr']}. Protocol: docs/experiments.md, section 5.",
        "",
        f"Pre-RL gap ({cfg['gap_tasks']} tasks, first call): P(valid | tool-list hint) = "
        f"**{pre['valid_with_hint']:.3f}**, P(valid | no hint) = **{pre['valid_without_hint']:.3f}** "
        f"(gap {gap:+.3f}).",
        f"Most frequent invalid names without the hint: {pre.get('invalid_names_without_hint', {})}.",
        "",
        *(
            ["**The gap is below 0.1: this setting cannot show an effect of self-distillation.**", ""]
            if gap < 0.1
            else []
        ),
        summary_table(results),
        "",
        "Final held-out invalid rate, mean over seeds (change from step 0):",
        "",
        *(
            f"- {a}: {v['final_invalid_mean']:.3f} ({v['change_mean']:+.3f} from step 0); "
            f"per seed {v['final_invalid_per_seed']}"
            for a, v in cmp["arms"].items()
        ),
        *(f"- {k.replace('_', ' ')}: {v:+.3f}" for k, v in cmp.items() if k != "arms"),
        "",
        f"CPU seconds: {results['cpu_s']}. Wall: {results['wall_s']} s. Plot: curves.png. Raw: results.json.",
        "",
    ]
    return "\n".join(lines)
