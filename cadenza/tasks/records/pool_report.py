"""Human views of the task pool: a table by state and level with pass-rate histograms, and a PNG over
training."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from cadenza.errors import CadenzaError
from cadenza.tasks.records.pool import STATES, TaskPool

_BINS = 10
_BLOCKS = " ▁▂▃▄▅▆▇█"


def histogram(values: list[float], bins: int = _BINS) -> list[int]:
    counts = [0] * bins
    for v in values:
        counts[min(int(v * bins), bins - 1)] += 1
    return counts


def sparkline(counts: list[int]) -> str:
    top = max(counts) if counts and max(counts) > 0 else 1
    return "".join(_BLOCKS[round(c / top * (len(_BLOCKS) - 1))] for c in counts)


def stats_table(pool: TaskPool) -> Table:
    """Rows: (state, level); columns: tasks, attempts, mean pass rate, histogram of posterior means over
    [0, 1]."""
    table = Table(title=f"task pool ({pool.path})")
    for col in ("state", "level", "tasks", "attempts", "mean pass", "pass-rate histogram 0→1"):
        table.add_column(
            col, justify="right" if col in ("level", "tasks", "attempts", "mean pass") else "left"
        )
    stats = pool.stats()
    for state in STATES:
        levels = sorted({s.level for s in stats if s.state == state})
        for level in levels:
            rows = [s for s in stats if s.state == state and s.level == level]
            seen = [s for s in rows if s.attempts > 0]
            mean = f"{sum(s.mean for s in seen) / len(seen):.2f}" if seen else "-"
            table.add_row(
                state,
                str(level),
                str(len(rows)),
                str(sum(s.attempts for s in rows)),
                mean,
                sparkline(histogram([s.mean for s in seen])) if seen else "(no attempts)",
            )
    if not stats:
        table.add_row("(empty)", "-", "0", "0", "-", "")
    return table


def pass_rate_history(pool: TaskPool) -> list[tuple[int, list[float]]]:
    """Per recorded step, the posterior mean pass rate of every task attempted so far."""
    a0, b0 = pool.config.prior_alpha, pool.config.prior_beta
    rows = pool._db.execute(
        "SELECT step, task_id, n, successes FROM pool_groups ORDER BY step, ts"
    ).fetchall()
    totals: dict[str, list[int]] = {}
    history: list[tuple[int, list[float]]] = []
    for i, (step, task, n, k) in enumerate(rows):
        t = totals.setdefault(task, [0, 0])
        t[0] += n
        t[1] += k
        if i + 1 == len(rows) or rows[i + 1][0] != step:
            history.append((step, [(a0 + s) / (a0 + b0 + m) for m, s in totals.values()]))
    return history


def plot_pass_rates(pool: TaskPool, path: str | Path) -> Path:
    """PNG: distribution of per-task pass rates over training steps (heatmap) and the mean."""
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise CadenzaError(
            "plotting needs matplotlib: pip install 'cadenza[train]' (or matplotlib)"
        ) from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    history = pass_rate_history(pool)
    path = Path(path)
    fig, ax = plt.subplots(figsize=(7, 3.5), dpi=110)
    if history:
        steps = [s for s, _ in history]
        grid = np.array([histogram(v) for _, v in history], dtype=float).T
        grid /= np.maximum(grid.sum(axis=0, keepdims=True), 1)
        ax.imshow(
            grid,
            origin="lower",
            aspect="auto",
            cmap="viridis",
            extent=(steps[0] - 0.5, steps[-1] + 0.5, 0, 1),
        )
        ax.plot(steps, [float(np.mean(v)) for _, v in history], color="white", lw=1.5, label="mean pass rate")
        ax.legend(loc="upper left", fontsize=8)
    ax.set_xlabel("training step")
    ax.set_ylabel("task pass rate (posterior mean)")
    ax.set_title("pass-rate distribution over training")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
