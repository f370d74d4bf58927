"""Rich tables for the task commands: build summary, task list, one task, scan findings, verify results."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from cadenza.tasks.records.task import Task


def out_console() -> Console:
    """stdout console; when piped (logs, CI) wide enough that tables keep their columns."""
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        return Console(width=140)
    return console


def summary_rows(summary: Any) -> list[dict[str, Any]]:
    """Per-source numbers of a build (also what ``cadenza demo`` and the benchmark report)."""
    out = []
    for rep in summary.reports:
        tasks = [t for t in summary.tasks if t["spec"] == rep.source]
        levels = Counter(t["level"] for t in tasks)
        out.append(
            {
                "source": rep.source,
                "status": rep.status,
                "reason": rep.reason,
                "tasks": len(tasks),
                "levels": {lv: levels.get(lv, 0) for lv in (1, 2, 3)},
                "f2p": sum(t["f2p"] for t in tasks),
                "p2p": sum(t["p2p"] for t in tasks),
                "candidates": rep.candidates,
                "validated": rep.validated,
                "rejected": rep.rejected,
                "yield": (rep.validated / rep.candidates) if rep.candidates else None,
                "suite_runs": rep.suite_runs,
                "seconds": rep.seconds,
            }
        )
    return out


def print_summary(summary: Any, console: Console) -> None:
    table = Table(title=f"Task set {summary.out}")
    for col in ("source", "status", "L1", "L2", "L3", "tasks", "F2P", "P2P", "yield", "suite runs", "time"):
        left = col in ("source", "status")
        table.add_column(
            col,
            justify="left" if left else "right",
            overflow="fold",
            no_wrap=True,
            min_width=min(len(max((r.source for r in summary.reports), key=len, default="")), 40)
            if col == "source"
            else None,
        )
    rows = summary_rows(summary)
    for r in rows:
        status = "[green]done" if r["status"] == "done" else f"[red]{r['status']}"
        y = f"{r['validated']}/{r['candidates']}" if r["candidates"] else "-"
        table.add_row(
            r["source"],
            status,
            *(str(r["levels"][lv]) for lv in (1, 2, 3)),
            str(r["tasks"]),
            str(r["f2p"]),
            str(r["p2p"]),
            y,
            str(r["suite_runs"]),
            f"{r['seconds']:.1f}s",
        )
    if len(rows) > 1:
        tot = lambda k: sum(r[k] for r in rows)  # noqa: E731
        cand, val = tot("candidates"), tot("validated")
        table.add_row(
            "[bold]total",
            "",
            *(str(sum(r["levels"][lv] for r in rows)) for lv in (1, 2, 3)),
            str(tot("tasks")),
            str(tot("f2p")),
            str(tot("p2p")),
            f"{val}/{cand}" if cand else "-",
            str(tot("suite_runs")),
            f"{summary.seconds:.1f}s",
        )
    console.print(table)
    console.print(
        "yield = validated / candidates tried; suite runs = full-suite-equivalent pytest runs", soft_wrap=True
    )
    for r in rows:
        if r["reason"]:
            console.print(
                f"{r['status']} {r['source']}: {r['reason']}", soft_wrap=True, markup=False, highlight=False
            )
    if summary.executor != "local":
        console.print(
            f"executor {summary.executor}: {summary.retried} unit(s) retried after a worker died, "
            f"{summary.lost} lost",
            soft_wrap=True,
        )
    for rej in summary.rejections:
        console.print(
            f"not published {rej['task_id']}: {rej['reason']}", soft_wrap=True, markup=False, highlight=False
        )


def tasks_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title=f"{len(rows)} task(s)")
    for col in ("id", "level", "kind", "qualname", "F2P", "P2P", "source"):
        table.add_column(col, overflow="fold", no_wrap=col in ("level", "F2P", "P2P"))
    for r in rows:
        table.add_row(
            r["id"], str(r["level"]), r["kind"], r["qualname"], str(r["f2p"]), str(r["p2p"]), r["source"]
        )
    return table


def print_task(task_dir: Path, task: Task, console: Console) -> None:
    head = (
        f"[bold]{task.id}[/]  level {task.level}  {task.feature.kind} [cyan]{task.feature.qualname}[/]\n"
        f"file {task.feature.path}   source {task.source}   dir {task_dir}"
    )
    console.print(Panel(head, title="task"))
    console.print(Panel(task.statement, title="statement"))
    tests = Table(title="tests")
    tests.add_column("kind")
    tests.add_column("node id")
    for t in task.fail_to_pass:
        tests.add_row("[red]FAIL_TO_PASS", t)
    for t in task.pass_to_pass[:20]:
        tests.add_row("[green]PASS_TO_PASS", t)
    if len(task.pass_to_pass) > 20:
        tests.add_row("[green]PASS_TO_PASS", f"... and {len(task.pass_to_pass) - 20} more")
    console.print(tests)


def findings_table(findings: list[Any]) -> Table:
    table = Table(title="Leak findings")
    for col in ("task", "channel", "path", "evidence"):
        table.add_column(col, overflow="fold")
    for f in findings:
        table.add_row(f.task_id, f.channel, f.path, f.evidence)
    return table


def verify_table(results: list[Any]) -> Table:
    table = Table(title="verify")
    for col in ("task", "result", "F2P", "P2P", "time", "reason"):
        table.add_column(col, overflow="fold")
    for r in results:
        table.add_row(
            r.task_id,
            "[green]ok" if r.ok else "[red]FAIL",
            str(r.f2p),
            str(r.p2p),
            f"{r.seconds:.1f}s",
            r.reason,
        )
    return table
