"""One (arm, seed) of the tool-hint experiment: train in segments of ``eval_every`` steps, score the fixed
held-out set after each, resume from the last finished segment.

RL arms run the ordinary trainer (each segment resumes the previous checkpoint, so the run is the one an
uninterrupted trainer would make); the ``supervised`` control runs its own loop on the same rollouts
(same task and sampling seeds) with cross-entropy toward the valid call at every erring turn.
Files in the run directory: ``metrics.jsonl`` (per step, with the diagnostic), ``heldout.jsonl`` (per
evaluation), ``checkpoints/``, and ``result.json`` once the run is complete.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from statistics import mean
from typing import Any

from cadenza.errors import CadenzaError
from cadenza.experiments.heldout import (
    ArmExperiment,
    evaluate,
    heldout_tasks,
    rates,
    run_episodes,
    supervised_examples,
)
from cadenza.experiments.toolworld import ToolworldSource
from cadenza.jsonio import atomic_write_json, atomic_write_text


def reached_at(evals: list[dict[str, Any]], target: float) -> int | None:
    """Index of the first evaluation whose valid rate, averaged with the one before it, is >= target."""
    for i in range(1, len(evals)):
        if mean([evals[i - 1]["valid_call_rate"], evals[i]["valid_call_rate"]]) >= target:
            return i
    return None


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


class _TrainerArm:
    def __init__(self, exp: ArmExperiment, arm: str, seed: int, model_dir: Path, run_dir: Path):
        self.exp, self.arm, self.seed, self.model_dir, self.run_dir = exp, arm, seed, model_dir, run_dir
        self.episodes = 0

    def train_to(self, steps: int) -> Any:
        from cadenza.rl.train.trainer import Trainer

        trainer = Trainer(self.exp.train_config(self.arm, self.seed, self.model_dir, self.run_dir, steps))
        trainer.train()
        self.episodes = trainer.episodes
        return trainer.policy


class _SupervisedArm:
    """The positive control: CE on (context up to an erring turn, the valid call), AdamW at the RL lr."""

    def __init__(self, exp: ArmExperiment, seed: int, model_dir: Path, run_dir: Path):
        self.exp, self.seed, self.model_dir, self.run_dir = exp, seed, model_dir, run_dir
        self.episodes = 0

    def train_to(self, steps: int) -> Any:
        import torch

        from cadenza.metrics import MetricsLogger, read_metrics
        from cadenza.rl.engines.policy import HFPolicy
        from cadenza.rl.learn.probe import HintProbe, ProbeSchedule
        from cadenza.rl.text.chat import load_tokenizer
        from cadenza.rl.train import checkpoint as ckpt

        exp = self.exp
        torch.set_num_threads(exp.threads)
        tok = load_tokenizer(str(self.model_dir))
        policy = HFPolicy.from_pretrained(self.model_dir)
        opt = torch.optim.AdamW(policy.model.parameters(), lr=exp.rl_lr)
        step, state = 0, {}
        latest = ckpt.latest_checkpoint(self.run_dir)
        if latest is not None:
            step, state = ckpt.load_checkpoint(latest, policy.model, opt)
        self.episodes = int(state.get("episodes", 0))
        logger = MetricsLogger(self.run_dir, resume_step=step)
        source = ToolworldSource(config=exp.toolworld)
        probe = HintProbe(source.probe_items(exp.probe_items, exp.heldout_seed), tok)
        sched = ProbeSchedule(probe, every=exp.eval_every, history=read_metrics(logger.path))
        while step < steps:
            step += 1
            row = sched.measure(step - 1, policy.model, policy.model)  # no teacher: the student's numbers
            base = self.seed * 1_000_003 + step  # the trainer's task and sampling seeds
            tasks = source.sample_tasks(
                random.Random(base), exp.tasks_per_step, (step - 1) * exp.tasks_per_step
            )
            with torch.no_grad():
                results, envs = run_episodes(
                    policy, tok, tasks, group_size=exp.group_size, seed=base, exp=exp
                )
            examples = supervised_examples(results, envs)
            loss = self._update(policy, tok, opt, examples) if examples else 0.0
            self.episodes += len(results)
            r = rates(results)
            logger.log(
                step,
                {
                    **row,
                    "episodes": self.episodes,
                    "valid_call_rate": r["valid_call_rate"],
                    "resolved_rate": r["success_rate"],
                    "supervised_examples": len(examples),
                    "supervised_loss": loss,
                },
            )
        logger.close()
        ckpt.save_checkpoint(
            self.run_dir, step, policy.model, opt, trainer_state={"episodes": self.episodes}, keep=1
        )
        return policy

    @staticmethod
    def _update(policy: Any, tok: Any, opt: Any, examples: list[list[dict[str, Any]]]) -> float:
        import torch

        from cadenza.rl.learn.sft import encode_messages, policy_token_logprobs
        from cadenza.rl.text.tokens import collate

        trajs = [encode_messages(tok, m) for m in examples]
        batch = collate(trajs, tok.pad_token_id)
        mask = torch.zeros_like(batch.loss_mask)
        for row, t in enumerate(trajs):  # only the target call: the context's turns are as sampled
            s, e = t.turn_spans[-1]
            mask[row, s:e] = batch.loss_mask[row, s:e]
        policy.model.train()
        lp, _ = policy_token_logprobs(policy, batch.input_ids, batch.attention_mask)
        loss = -(lp * mask).sum() / mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.model.parameters(), 1.0)
        opt.step()
        return float(loss.detach())


def run_arm(
    exp: ArmExperiment,
    arm: str,
    seed: int,
    model_dir: Path,
    run_dir: Path,
    *,
    steps: int,
    stop_at_target: bool = False,
) -> dict[str, Any]:
    """Run (or resume) one (arm, seed) for ``steps`` steps; ``stop_at_target``: end early once reached."""
    import dataclasses
    import time

    from cadenza.experiments.provenance import code_version, settings_digest
    from cadenza.rl.engines.policy import HFPolicy
    from cadenza.rl.text.chat import load_tokenizer

    done = run_dir / "result.json"
    if done.exists():
        return json.loads(done.read_text())
    t0 = time.time()
    digest = settings_digest(dataclasses.asdict(exp))
    run_dir.mkdir(parents=True, exist_ok=True)
    pin = run_dir / "run.json"  # what this directory holds: a resume must match it
    if pin.exists():
        old = json.loads(pin.read_text())
        if old.get("settings_digest") != digest:
            raise CadenzaError(
                f"{run_dir}: a run with other settings (digest {old.get('settings_digest')}, now {digest}); "
                "remove the directory to rerun it"
            )
    else:
        atomic_write_json(pin, {"arm": arm, "seed": seed, "settings_digest": digest, "wall_s": 0.0})
    tok = load_tokenizer(str(model_dir))
    tasks = heldout_tasks(exp.heldout_tasks, exp.heldout_seed, exp.toolworld)
    evals_path = run_dir / "heldout.jsonl"
    evals = _read_jsonl(evals_path)
    device = getattr(exp, "device", "cpu")
    start = HFPolicy.from_pretrained(model_dir, device=device)  # the targeted measures' reference

    def record(step: int, episodes: int, policy: Any) -> None:
        e = evaluate(policy, tok, tasks, exp.heldout_seed, exp, start=start)
        evals.append({"step": step, "episodes": episodes, **e})
        atomic_write_text(evals_path, "".join(json.dumps(e) + "\n" for e in evals))
        spent = json.loads(pin.read_text())  # wall time summed over every invocation that worked here
        spent["wall_s"] = round(spent.get("wall_s", 0.0) + time.time() - t_seg[0], 1)
        atomic_write_json(pin, spent)
        t_seg[0] = time.time()

    t_seg = [t0]
    if not evals:
        record(0, 0, start)
    runner = (
        _SupervisedArm(exp, seed, model_dir, run_dir)
        if arm == "supervised"
        else _TrainerArm(exp, arm, seed, model_dir, run_dir)
    )
    while evals[-1]["step"] < steps and not (stop_at_target and reached_at(evals, exp.target) is not None):
        nxt = min(evals[-1]["step"] + exp.eval_every, steps)
        policy = runner.train_to(nxt)
        record(nxt, runner.episodes, policy)
    summary = summarise(exp, seed, evals, run_dir)
    summary |= {
        "settings_digest": digest,
        "code": code_version(),
        "wall_s": json.loads(pin.read_text())["wall_s"],
    }
    atomic_write_json(done, summary)
    return summary


def summarise(exp: ArmExperiment, seed: int, evals: list[dict[str, Any]], run_dir: Path) -> dict[str, Any]:
    """The run's numbers (definitions in docs/experiments.md, section 4)."""
    from cadenza.experiments.report import summarise_run
    from cadenza.metrics import read_metrics

    rows = read_metrics(run_dir / "metrics.jsonl")
    batch = summarise_run(rows, seed, target=exp.target, window=exp.window)
    from cadenza.experiments.targeted import clean_success

    hit = reached_at(evals, exp.target)
    last = evals[-1]
    probe_keys = (
        "probe_teacher_hinted",
        "probe_teacher_unhinted",
        "probe_student_hinted",
        "probe_student_unhinted",
    )
    return {
        "seed": seed,
        "episodes_to_95": evals[hit]["episodes"] if hit is not None else None,
        "steps_to_95": evals[hit]["step"] if hit is not None else None,
        "final_success": last["success_rate"],
        "final_invalid_rate": last["invalid_rate"],
        "steps": last["step"],
        "final_other_errors": last.get("other_errors"),
        "final_unhinted_kl": last.get("unhinted_kl"),
        "final_unhinted_entropy": last.get("unhinted_entropy"),
        "final_clean_success": clean_success(evals),
        "clean_tasks": None if "tool_error" not in evals[0] else evals[0]["tool_error"].count(0),
        "curve": batch["curve"],
        "train_episodes_to_95": batch["episodes_to_95"],
        "heldout_curve": [[e["episodes"], e["invalid_rate"], e["success_rate"]] for e in evals],
        "heldout_kl_curve": [[e["episodes"], e.get("unhinted_kl"), e.get("unhinted_entropy")] for e in evals],
        "probe_curve": [
            [r["probe_weights_step"] * exp.episodes_per_step, *(r[k] for k in probe_keys)]
            for r in rows
            if r.get("probe_teacher_hinted") is not None
        ],
    }
