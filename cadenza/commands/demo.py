"""``cadenza demo``: the main job on an embedded default (see README).

By default the whole pipeline at toy scale on a CPU (:mod:`cadenza.rl.train.demo`): tasks from a real PyPI
package, a tiny warm-started policy, a few RL steps over the task pool with curriculum, and a report; then
the toolworld phase (:mod:`cadenza.experiments.demo`), where GRPO and GRPO + SD train side by side from one
warm-up model and the held-out invalid-call rate shows what the text feedback adds.
``--tasks-only`` keeps the task-factory demo; ``--model`` runs a local HF checkpoint (``--device cuda``).
"""

from __future__ import annotations

import os
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def demo(
        out: Path = typer.Option(
            Path("runs/demo"), "--out", help="Run directory (tasks/, policy/, train/; a rerun resumes)."
        ),
        source: str | None = typer.Option(
            None, "--source", help="Override the embedded default PyPI package."
        ),
        max_tasks: int | None = typer.Option(
            None, "--max-tasks", help="Tasks to build (default 6; 12 with --tasks-only)."
        ),
        skip_toolworld: bool = typer.Option(
            False, "--skip-toolworld", help="Leave out the toolworld phase (GRPO vs GRPO + SD)."
        ),
        toolworld_steps: int = typer.Option(
            20, "--toolworld-steps", help="RL steps of each toolworld arm (the fixed default is measured)."
        ),
        tasks_only: bool = typer.Option(
            False, "--tasks-only", help="Only build the task set and print its summary."
        ),
        steps: int = typer.Option(3, "--steps", help="RL steps."),
        model: Path | None = typer.Option(
            None, "--model", help="Local HF checkpoint (with its tokenizer), or smollm2, as the policy."
        ),
        device: str = typer.Option("cpu", "--device", help="Torch device for the policy, e.g. cuda."),
        task_set: Path | None = typer.Option(
            None, "--task-set", help="Train on this existing task set instead of building one."
        ),
        tasks_per_step: int = typer.Option(2, "--tasks-per-step", help="Tasks per RL step."),
        group_size: int = typer.Option(4, "--group-size", help="Rollouts per task (a GRPO group)."),
        max_turns: int = typer.Option(3, "--max-turns", help="Tool calls per episode."),
        max_new_tokens: int = typer.Option(40, "--max-new-tokens", help="Tokens per model turn."),
        engine: str = typer.Option("hf", "--engine", help="Rollout engine: hf or vllm (docs/async.md)."),
        max_staleness: int = typer.Option(
            0, "--max-staleness", help="Steps rollouts may run ahead of training (0 = synchronous)."
        ),
    ) -> None:
        """Tasks from a real package -> tiny policy -> RL (sandbox, monitor, feedback, GRPO + SD, curriculum)
        -> report."""
        from rich.console import Console

        from cadenza import preflight
        from cadenza.tasks.records.report import out_console

        console = out_console()
        preflight.for_demo(out, sandboxed=not tasks_only)  # in the first second, not minutes in
        if tasks_only:
            from cadenza.tasks.builder.demo import DEMO_MAX_TASKS, DEMO_SOURCE, build_demo_tasks
            from cadenza.tasks.records.report import print_summary

            tasks_out = out / "tasks"
            summary = build_demo_tasks(
                tasks_out,
                source=source or DEMO_SOURCE,
                max_tasks=max_tasks or DEMO_MAX_TASKS,
                console=Console(stderr=True),
            )
            print_summary(summary, console)
            n = len(summary.tasks)
            console.print(f"{n} validated task(s) in {summary.out}; try: cadenza tasks list {tasks_out}")
            if n == 0:
                raise typer.Exit(1)
            return

        import time

        from cadenza.experiments import demo as tw
        from cadenza.rl.config import RolloutConfig, engine_checks
        from cadenza.rl.train.demo import DemoConfig, check_policy, report_table, run_demo
        from cadenza.tasks.records.pool import TaskPool
        from cadenza.tasks.records.pool_report import stats_table

        t0 = time.time()
        err = Console(stderr=True)
        tw_cfg = None if skip_toolworld else tw.ToolworldDemoConfig(steps=toolworld_steps)
        cfg = DemoConfig(
            out=out,
            source=source,
            steps=steps,
            model=str(model) if model else None,
            device=device,
            task_set=task_set,
            tasks_per_step=tasks_per_step,
            group_size=group_size,
            max_turns=max_turns,
            max_new_tokens=max_new_tokens,
            engine=engine,
            max_staleness=max_staleness,
            **({"max_tasks": max_tasks} if max_tasks else {}),
        )
        preflight.run_checks(engine_checks(RolloutConfig(engine=engine)))  # e.g. --engine vllm, not installed
        check_policy(cfg)  # a bad --device or --model: one line before the toolworld warm-up starts
        warm_up = None
        if tw_cfg is not None:  # its warm-up runs beside the real-task phase (a stale directory fails now)
            warm_up = tw.start_warm_up(out / "toolworld", tw_cfg)
        result = run_demo(cfg, console=err, log=lambda m: err.print(f"[dim]{m}"))
        console.print(report_table(result.rows))
        with TaskPool(result.task_set) as pool:
            console.print(stats_table(pool))
        console.print(
            f"task set: {result.task_set}\npolicy: {result.model_dir}\nrun (metrics.jsonl, checkpoints): "
            f"{result.run_dir}\npass-rate plot: {result.plot}"
        )
        if tw_cfg is not None:
            res = tw.run_toolworld_demo(
                out / "toolworld", tw_cfg, log=lambda m: err.print(f"[dim]{m}"), warm_up=warm_up
            )
            console.print(tw.toolworld_table(res))
            console.print(tw.outcome_line(res))
            console.print(tw.cost_line(res))
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        console.print(f"demo: {time.time() - t0:.0f} s wall in all, load average {load}")
