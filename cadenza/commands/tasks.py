"""``cadenza tasks ...``: build, scan, list, show, verify, env, export, stats (see docs/tasks.md,
docs/curriculum.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from cadenza.commands.options import executor_option, ray_address_option
from cadenza.errors import CadenzaError


def _levels(text: str) -> tuple[int, ...]:
    try:
        return tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise CadenzaError(f"--levels takes comma-separated numbers from 1,2,3, got {text!r}") from None


def register(app: typer.Typer) -> None:
    tasks = typer.Typer(
        help="Feature-deletion tasks: build, scan, list, show, verify, env, export, stats.",
        no_args_is_help=True,
    )
    app.add_typer(tasks, name="tasks")

    @tasks.command()
    def build(
        sources: list[str] = typer.Argument(
            ..., help="Local dir, local git repo, or pypi:NAME[==VERSION]; many allowed."
        ),
        out: Path = typer.Option(..., "--out", help="Task set directory (created; a rerun resumes it)."),
        workers: int = typer.Option(
            1,
            "--workers",
            help="Worker processes: sources in parallel, spare ones validate candidates of a source.",
        ),
        max_tasks: int | None = typer.Option(None, "--max-tasks", help="At most this many tasks per source."),
        levels: str = typer.Option("1,2,3", "--levels", help="Deletion levels to build, e.g. 1,2."),
        seed: int = typer.Option(0, "--seed", help="Candidate order seed."),
        statement_llm: str | None = typer.Option(
            None, "--statement-llm", help="OpenAI-compatible URL for statements."
        ),
        quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
        executor: str = executor_option("Where sources are built: local (processes) or ray (a cluster)."),
        ray_address: str = ray_address_option(),
    ) -> None:
        """Build validated, leak-free tasks from SOURCEs into a task set."""
        from rich.console import Console

        from cadenza.tasks.builder.factory import BuildConfig, build_tasks
        from cadenza.tasks.records.report import out_console, print_summary

        console = Console(stderr=True)
        cfg = BuildConfig(
            out=out,
            workers=workers,
            max_tasks=max_tasks,
            levels=_levels(levels),
            seed=seed,
            statement_llm=statement_llm,
            progress=not quiet,
            executor=executor,
            ray_address=ray_address,
        )
        summary = build_tasks(sources, cfg, console=console)
        print_summary(summary, out_console())
        if not summary.tasks:
            raise typer.Exit(1)

    @tasks.command()
    def scan(path: Path = typer.Argument(..., help="A task dir or a task set.")) -> None:
        """Search everything a task can reach for its deleted code; exit 1 on findings."""
        from cadenza.tasks.leaks.scan import find_task_dirs, scan_tasks
        from cadenza.tasks.records.report import findings_table, out_console

        if not path.exists():
            raise CadenzaError(f"{path} does not exist; pass a task dir or a task set")
        dirs = find_task_dirs(path)
        if not dirs:
            raise CadenzaError(f"{path} holds no tasks (no task.json); pass a task dir or a task set")
        findings = scan_tasks(dirs)
        console = out_console()
        if findings:
            console.print(findings_table(findings))
            console.print(
                f"[red]{len(findings)} finding(s) in {len({f.task_id for f in findings})} of "
                f"{len(dirs)} task(s)"
            )
            raise typer.Exit(1)
        console.print(f"[green]clean: {len(dirs)} task(s), no remnants of deleted code")

    @tasks.command("list")
    def list_(
        path: Path = typer.Argument(..., help="Task set."), as_json: bool = typer.Option(False, "--json")
    ) -> None:
        """List the tasks of a set."""
        from cadenza.tasks.records.report import out_console, tasks_table
        from cadenza.tasks.records.store import TaskStore

        rows = TaskStore(path).rows()
        if as_json:
            typer.echo(json.dumps(rows, indent=2))
        else:
            out_console().print(tasks_table(rows))

    @tasks.command()
    def show(
        path: Path = typer.Argument(..., help="Task set."), task_id: str = typer.Argument(..., metavar="ID")
    ) -> None:
        """Show one task: feature, level, statement, tests."""
        from cadenza.tasks.records.report import out_console, print_task
        from cadenza.tasks.records.store import TaskStore
        from cadenza.tasks.records.task import load_task

        task_dir = TaskStore(path).task_dir(task_id)
        print_task(task_dir, load_task(task_dir), out_console())

    @tasks.command()
    def verify(
        path: Path = typer.Argument(..., help="Task set."),
        task: str | None = typer.Option(None, "--task", help="Only this task ID."),
    ) -> None:
        """Re-validate tasks in clean copies (F2P fail, P2P pass, gold patch passes all) and leak-scan
        them."""
        from cadenza.tasks.records.report import out_console, verify_table
        from cadenza.tasks.records.store import TaskStore
        from cadenza.tasks.validation.verify import verify_task

        store = TaskStore(path)
        dirs = [store.task_dir(task)] if task else store.task_dirs()
        if not dirs:
            raise CadenzaError(f"{path} has no tasks to verify")
        results = [verify_task(d) for d in dirs]
        console = out_console()
        console.print(verify_table(results))
        bad = [r for r in results if not r.ok]
        for r in bad:
            typer.echo(f"FAIL {r.task_id}: {r.reason}")
        typer.echo(f"{len(results) - len(bad)} of {len(results)} task(s) verified")
        if bad:
            raise typer.Exit(1)

    @tasks.command()
    def env(task_dir: Path = typer.Argument(..., help="A task directory.")) -> None:
        """Print the python executable of the task's environment."""
        from cadenza.tasks.records.task import task_python

        typer.echo(str(task_python(task_dir).absolute()))

    @tasks.command()
    def export(
        path: Path = typer.Argument(..., help="Task set."),
        fmt: str = typer.Option("swebench", "--format", help="Only 'swebench' (JSONL)."),
        output: Path | None = typer.Option(None, "--output", "-o", help="Write here instead of stdout."),
    ) -> None:
        """Export the set as SWE-bench-style JSONL (instance_id, problem_statement, patch, FAIL_TO_PASS,
        ...)."""
        from cadenza.jsonio import atomic_write_text
        from cadenza.tasks.records.export import export_swebench

        if fmt != "swebench":
            raise CadenzaError(f"unknown export format {fmt!r}; use --format swebench")
        text = "".join(json.dumps(rec) + "\n" for rec in export_swebench(path))
        if output is None:
            sys.stdout.write(text)
        else:
            atomic_write_text(output, text)

    @tasks.command()
    def stats(
        path: Path = typer.Argument(..., help="Task set."),
        plot: Path | None = typer.Option(
            None, "--plot", help="Also write a PNG of the pass-rate distribution over training."
        ),
    ) -> None:
        """The task pool by state and level: tasks, attempts, mean pass rate, pass-rate histograms."""
        from cadenza.tasks.records.pool import TaskPool
        from cadenza.tasks.records.pool_report import plot_pass_rates, stats_table
        from cadenza.tasks.records.report import out_console
        from cadenza.tasks.records.store import TaskStore

        rows = TaskStore(path).rows()  # a clear error when PATH is not a task set
        with TaskPool(path) as pool:
            pool.add_tasks(
                [(r["id"], r["spec"], int(r["level"])) for r in rows]
            )  # tasks never trained on show too
            console = out_console()
            console.print(stats_table(pool))
            if plot is not None:
                console.print(f"pass-rate plot: {plot_pass_rates(pool, plot)}")
