"""Scale-out throughput: task building and rollout episodes at 1 and 2 workers, local vs Ray, next to
the capacity model.

Builds the same sources (base envs warmed first: env cost is per requirement set) with the
``local`` executor and with a private loopback Ray cluster, at 1 and 2 workers, and reports
tasks/minute (wall clock from the first unit submitted: a private cluster's start-up and the node
checks are reported apart, as ``startup_seconds``), whether every build published the same task ids,
and what :mod:`cadenza.scale` predicts: a 2-worker build from the same executor's 1-worker build
(each source's own work, fetch + base env + baseline, stays serial; its candidates split: Amdahl),
the 1-worker Ray build from the local one. Episodes: 2 actors twice one actor, one actor the local
worker. Predictions are capped at the machine's cores; ``loadavg`` is reported (other load makes
every figure lower). Prints ONE JSON object.

    python bench/scale.py [--packages pypi:a,pypi:b] [--max-tasks 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PACKAGES = ["pypi:cachetools==8.0.2", "pypi:toolz==1.2.0"]


def cpu_seconds() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def build(sources: list[str], out: Path, executor: str, workers: int, max_tasks: int) -> dict:
    from cadenza.tasks.builder.factory import BuildConfig, build_tasks

    cfg = BuildConfig(
        out=out, workers=workers, max_tasks=max_tasks, levels=(1,), seed=1, progress=False, executor=executor
    )
    cpu0, wall0 = cpu_seconds(), time.monotonic()
    summary = build_tasks(sources, cfg)
    total, cpu = time.monotonic() - wall0, cpu_seconds() - cpu0
    wall = total - summary.startup_seconds  # from the first unit submitted: cluster start-up excluded
    with sqlite3.connect(out / "index.sqlite") as con:
        ids = sorted(r[0] for r in con.execute("SELECT id FROM tasks"))
    return {
        "tasks": len(ids),
        "wall_seconds": round(wall, 1),
        "startup_seconds": round(summary.startup_seconds, 1),
        "tasks_per_min": round(len(ids) / wall * 60, 2) if wall else None,
        "driver_cpu_seconds": round(cpu, 1),  # local inline builds: all of it; others: the driver's share
        "loadavg": round(os.getloadavg()[0], 2),  # the machine is shared: other load lowers every figure
        "retried": summary.retried,
        "lost": summary.lost,
        # per source: (prepare, candidates) seconds on its worker, the capacity model's inputs
        "sources": [(r.prepare_seconds, round(r.seconds - r.prepare_seconds, 2)) for r in summary.reports],
        "ids": ids,
    }


def bench_episodes(root: Path, n_units: int) -> dict:
    """Episodes/minute of the same rollout units run locally and by 1 and 2 Ray actors."""
    import torch

    from cadenza.executor import ExecutorConfig
    from cadenza.rl.config import EnvConfig, ModelConfig, RolloutConfig, RunConfig, TrainConfig
    from cadenza.rl.rollout.envs import load_source
    from cadenza.rl.rollout.episodes import sample_step_tasks
    from cadenza.rl.text.chat import CHAT_TEMPLATE, train_tokenizer
    from cadenza.rl.train.build import build_policy
    from cadenza.rl.train.ray_workers import RayWorkers
    from cadenza.rl.train.workers import LocalWorkers, Unit

    torch.set_num_threads(1)
    tok = train_tokenizer(["view create ls rm path name arguments " * 20] * 50, vocab_size=300)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(str(root / "tok"))
    cfg = TrainConfig(
        run=RunConfig(out_dir=str(root / "run"), seed=0, progress=False, threads=1),
        model=ModelConfig(tokenizer=str(root / "tok"), hidden_size=64, num_heads=4, num_kv_heads=2),
        env=EnvConfig(name="toolworld", options={"min_steps": 2, "max_steps": 2}),
        rollout=RolloutConfig(group_size=4, tasks_per_step=n_units, max_new_tokens=48, max_turns=3),
    )
    _, policy = build_policy(cfg)
    weights = dict(policy.model.named_parameters())
    source = load_source(cfg.env.name, cfg.env.options)
    units = [Unit(step=1, index=i, task=t) for i, t in enumerate(sample_step_tasks(source, cfg, 1))]
    episodes = len(units) * cfg.rollout.group_size
    out: dict = {}
    for name, make in (
        ("local_1", lambda: LocalWorkers(cfg)),
        ("ray_1", lambda: RayWorkers(cfg, 1, ExecutorConfig(kind="ray", workers=1))),
        ("ray_2", lambda: RayWorkers(cfg, 2, ExecutorConfig(kind="ray", workers=2))),
    ):
        workers = make()
        try:
            workers.sync(weights.items(), 0)
            workers.run(units[:1])  # warm: first forward, imports
            t0 = time.monotonic()
            workers.run(units)
            wall = time.monotonic() - t0
        finally:
            workers.close()
        out[name] = {
            "loadavg": round(os.getloadavg()[0], 2),
            "episodes": episodes,
            "wall_seconds": round(wall, 2),
            "episodes_per_min": round(episodes / wall * 60, 1),
        }
    return out


def predict_builds(runs: dict[str, dict], cores: int) -> dict[str, float]:
    """Each build's tasks/minute as the capacity model predicts it: a 2-worker build from its
    executor's 1-worker build (per-source prepare and candidate seconds, Amdahl's law, capped at the
    cores, plus the 1-worker build's time outside its sources), the 1-worker Ray build from the local
    one (no Ray overhead assumed: the gap is Ray's)."""
    from cadenza.scale import predict_build_seconds

    def rate(base: dict, workers: int) -> float:
        # what the 1-worker build spent outside its sources (dispatch, results, the store) stays
        overhead = max(0.0, base["wall_seconds"] - predict_build_seconds(base["sources"], 1))
        wall = predict_build_seconds(base["sources"], min(workers, cores)) + overhead
        return round(base["tasks"] / wall * 60, 2) if wall else 0.0

    return {
        "local_1": runs["local_1"]["tasks_per_min"],
        "local_2": rate(runs["local_1"], 2),
        "ray_1": runs["local_1"]["tasks_per_min"],
        "ray_2": rate(runs["ray_1"], 2),
    }


def main() -> None:
    from cadenza.tasks.sources.fetch import fetch_source
    from cadenza.tasks.sources.venv import ensure_base_env

    ap = argparse.ArgumentParser()
    ap.add_argument("--packages", default=",".join(PACKAGES))
    ap.add_argument("--max-tasks", type=int, default=3)
    ap.add_argument(
        "--units", type=int, default=8, help="rollout units (groups of 4 episodes) per measurement"
    )
    args = ap.parse_args()
    sources = args.packages.split(",")
    runs: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="cadenza-scale-") as tmp:
        for i, spec in enumerate(sources):
            ensure_base_env(fetch_source(spec, Path(tmp) / f"warm{i}"))
        for executor, workers in (("local", 1), ("local", 2), ("ray", 1), ("ray", 2)):
            runs[f"{executor}_{workers}"] = build(
                sources, Path(tmp) / f"{executor}{workers}", executor, workers, args.max_tasks
            )
            print(f"{executor}_{workers}: {runs[f'{executor}_{workers}']}", file=sys.stderr, flush=True)
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0]
    predicted = predict_builds(runs, cores)
    ids = {k: v.pop("ids") for k, v in runs.items()}
    with tempfile.TemporaryDirectory(prefix="cadenza-scale-ep-") as tmp:
        episodes = bench_episodes(Path(tmp), args.units)
    # episodes are independent units: n workers run n times as many, up to the cores; Ray's first
    # actor is predicted to run as fast as the local worker (its overhead is the gap)
    ep = {k: v["episodes_per_min"] for k, v in episodes.items()}
    ep_pred = {
        "local_1": ep["local_1"],
        "ray_1": ep["local_1"],
        "ray_2": round(ep["ray_1"] * min(2, cores), 1),
    }
    print(
        json.dumps(
            {
                "tasks_per_min": {k: v["tasks_per_min"] for k, v in runs.items()},
                "predicted_tasks_per_min": predicted,
                "same_task_ids": all(v == ids["local_1"] for v in ids.values()),
                "runs": runs,
                "episodes_per_min": {k: v["episodes_per_min"] for k, v in episodes.items()},
                "predicted_episodes_per_min": ep_pred,
                "episode_runs": episodes,
                "cores": cores,
                "loadavg": round(load, 2),  # 1-minute load average when the builds ended
                "loadavg_end": [round(x, 2) for x in os.getloadavg()],  # 1, 5, 15 min, at the very end
                "sources": sources,
            }
        )
    )


if __name__ == "__main__":
    main()
