"""``cadenza eval TASKS_DIR --endpoint URL --model NAME``: a served model as the agent over a task set."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from cadenza.commands.options import executor_option, ray_address_option


def register(app: typer.Typer) -> None:
    @app.command(name="eval")
    def eval_cmd(
        tasks_dir: Path = typer.Argument(
            ..., help="A task set (directory of task dirs, optionally with index.sqlite) or one task dir."
        ),
        endpoint: str = typer.Option(
            ..., "--endpoint", help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1."
        ),
        model: str = typer.Option(..., "--model", help="Model name as the server knows it."),
        concurrency: int = typer.Option(4, "--concurrency", help="Episodes run at the same time."),
        max_turns: int = typer.Option(30, "--max-turns", help="Tool-call turns per episode."),
        no_tool_call: str = typer.Option(
            "nudge", "--no-tool-call", help="A turn without a tool call: nudge (answer it, go on) or end."
        ),
        out: Path = typer.Option(
            Path("runs/eval"), "--out", help="Directory for trajectories and summary.json."
        ),
        timeout_s: float = typer.Option(120.0, "--timeout", help="Seconds to wait for one model reply."),
        retries: int = typer.Option(
            3, "--retries", help="Retries per model call (connection errors, 429, 5xx)."
        ),
        temperature: float = typer.Option(0.0, "--temperature"),
        no_sandbox: bool = typer.Option(
            False, "--no-sandbox", help="Run tools without bubblewrap (trusted debugging only)."
        ),
        judge_endpoint: str | None = typer.Option(
            None, "--judge-endpoint", help="Optional LLM judge (OpenAI-compatible) adding monitor flags."
        ),
        judge_model: str | None = typer.Option(None, "--judge-model", help="Model name of the LLM judge."),
        executor: str = executor_option("Where episodes run: local (threads here) or ray (a cluster)."),
        ray_address: str = ray_address_option(),
    ) -> None:
        """Run a model behind a chat-completions API as the agent on every task; print resolved rate, flags,
        turns, time."""
        from cadenza.agent.evaluate import EvalConfig, discover_tasks, evaluate
        from cadenza.agent.llm import LLMConfig
        from cadenza.errors import CadenzaError
        from cadenza.executor import ExecutorConfig, preflight
        from cadenza.monitor import JudgeConfig

        if (judge_endpoint is None) != (judge_model is None):
            raise CadenzaError("--judge-endpoint and --judge-model go together; pass both or neither")
        judge = (
            JudgeConfig(endpoint=judge_endpoint, model=judge_model, api_key=os.environ.get("OPENAI_API_KEY"))
            if judge_endpoint and judge_model
            else None
        )

        llm = LLMConfig(endpoint=endpoint, model=model, api_key=os.environ.get("OPENAI_API_KEY"),
                        timeout_s=timeout_s, max_retries=retries, temperature=temperature)  # fmt: skip
        ex = ExecutorConfig(kind=executor, ray_address=ray_address, workers=concurrency)  # type: ignore[arg-type]
        preflight(ex)  # Ray missing or an address that does not answer: one line, before any work
        config = EvalConfig(tasks_dir=tasks_dir, llm=llm, out_dir=out, concurrency=concurrency,
                            max_turns=max_turns, no_tool_call=no_tool_call, no_sandbox=no_sandbox,
                            judge=judge, executor=ex)  # fmt: skip
        n = len(discover_tasks(tasks_dir))
        report = _run_with_progress(config, n, evaluate)
        _print_report(report, out)
        if report.results and report.errored == len(report.results):
            typer.echo(f"error: every episode failed; first error: {report.results[0].error}", err=True)
            raise typer.Exit(1)


def _run_with_progress(config, n, evaluate):  # type: ignore[no-untyped-def]
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("[bold]eval"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[last]}"))
    with Progress(*columns, TimeElapsedColumn(), transient=False) as progress:
        bar = progress.add_task("eval", total=n, last="")

        def on_result(res) -> None:  # type: ignore[no-untyped-def]
            mark = (
                "error"
                if res.error
                else "flagged"
                if res.flags
                else "resolved"
                if res.resolved
                else "unresolved"
            )
            progress.update(bar, advance=1, last=f"{res.task_id}: {mark}")

        return evaluate(config, on_result=on_result)


def _print_report(report, out: Path) -> None:  # type: ignore[no-untyped-def]
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"cadenza eval: {len(report.results)} tasks")
    for col in ("task", "resolved", "reward", "turns", "flags", "seconds", "error"):
        table.add_column(col)
    for r in report.results:
        resolved = (
            ("[yellow]graded only (flagged)[/]" if r.flags else "[green]yes[/]")
            if r.resolved
            else "[red]no[/]"
        )
        table.add_row(
            r.task_id,
            resolved,
            f"{r.reward:g}",
            str(r.turns),
            ", ".join(sorted(set(r.flags))) or "-",
            f"{r.seconds:.1f}",
            (r.error or "")[:60],
        )
    console = Console()
    console.print(table)
    summary = Table(show_header=False, title="summary")
    summary.add_row("resolved rate", f"{report.resolved_rate:.1%} (grader alone: {report.graded_rate:.1%})")
    summary.add_row("mean turns", f"{report.mean_turns:.1f}")
    summary.add_row(
        "flags per rule", ", ".join(f"{k}: {v}" for k, v in report.flags_per_rule.items()) or "none"
    )
    summary.add_row("errored", str(report.errored))
    summary.add_row("time", f"{report.seconds:.1f} s")
    summary.add_row("trajectories", str(out))
    console.print(summary)
