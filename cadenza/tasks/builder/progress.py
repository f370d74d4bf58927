"""The build's progress bars, fed by the messages source workers send through the executor."""

from __future__ import annotations

import threading
from typing import Any

from cadenza.executor import EventQueue, drain


class BuildProgress:
    """One bar per source plus an overall bar; a thread drains the executor's event queue.

    Messages (sent by :func:`cadenza.tasks.builder.factory.build_source` via :func:`cadenza.executor.emit`):
    ``("plan", spec, n, skipped)``, ``("tried", spec, tried, validated)``, ``("task", spec, id)``,
    ``("leak", spec, id, findings)``, ``("source", spec, report_dict)``.
    """

    def __init__(
        self, sources: list[str], per_source: int | None, events: EventQueue, *, console: Any, show: bool
    ):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.per_source = per_source
        self.events = events
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[note]}"),
            TimeElapsedColumn(),
            console=console,
            disable=not show,
            transient=False,
        )
        self.overall = self.progress.add_task("sources", total=len(sources), note="")
        self.bars = {s: self.progress.add_task(s[-40:], total=per_source, note="") for s in sources}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> BuildProgress:
        self.progress.__enter__()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for msg in drain(self.events, timeout=0.3):  # what arrived after the last poll
            self.handle(msg)
        self.progress.__exit__(*exc)

    def _run(self) -> None:
        while not self._stop.is_set():
            for msg in drain(self.events):
                self.handle(msg)

    def handle(self, msg: Any) -> None:
        kind, spec = msg[0], msg[1]
        bar, p = self.bars.get(spec), self.progress
        if bar is None:
            return
        if kind == "task":
            p.advance(bar)
        elif kind == "plan":
            skipped = f", {msg[3]} already in the set" if msg[3] else ""
            p.update(bar, note=f"{msg[2]} candidates{skipped}")
        elif kind == "tried":
            p.update(bar, note=f"validated {msg[3]} of {msg[2]} tried")
        elif kind == "leak":
            p.update(bar, note=f"[yellow]dropped {msg[2]} (leak)")
        elif kind == "source":
            rep = msg[2]
            done = rep["status"] == "done"
            note = f"[green]{rep['emitted']} tasks" if done else f"[red]{rep['status']}: {rep['reason'][:60]}"
            total = max(rep["emitted"], 1) if self.per_source is None else self.per_source
            completed = rep["emitted"] if self.per_source is None or not done else self.per_source
            p.update(bar, total=total, completed=completed, note=note)
            p.advance(self.overall)
