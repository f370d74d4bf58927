"""Per-step metrics of every trainer (RL and pretraining): one JSON object per line in ``metrics.jsonl``,
optionally mirrored to TensorBoard.

On resume the file is cut back to the resumed step, so a run that crashed after logging step 7 but
checkpointing step 6 does not end up with two step-7 rows. Non-finite numbers are written as ``null``
(JSON has no NaN).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from cadenza.jsonio import atomic_write_text


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class MetricsLogger:
    """``enabled=False`` (ranks other than 0 of a distributed run) writes nothing."""

    def __init__(
        self, out_dir: str | Path, *, resume_step: int = 0, tensorboard: bool = False, enabled: bool = True
    ):
        self.path = Path(out_dir) / "metrics.jsonl"
        self.enabled = enabled
        self._tb = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= resume_step]
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(Path(out_dir) / "tensorboard"))
            except ImportError:  # tensorboard not installed: JSONL only
                self._tb = None

    @property
    def tensorboard_enabled(self) -> bool:
        return self._tb is not None

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        row = {"step": step, **{k: _clean(v) for k, v in metrics.items() if k != "step"}}
        with self.path.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
            fh.flush()
        if self._tb is not None:
            for k, v in row.items():
                if isinstance(v, int | float) and k != "step" and v is not None:
                    self._tb.add_scalar(k, v, step)
            self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def _clean(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v
