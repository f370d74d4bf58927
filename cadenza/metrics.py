"""Per-step metrics of every trainer (RL and pretraining): one JSON object per line in ``metrics.jsonl``,
optionally mirrored to TensorBoard and to Weights & Biases (``wandb``; ``WANDB_MODE=offline`` needs no
network). The one logger feeds all three with the same rows.

On resume the file is cut back to the resumed step, so a run that crashed after logging step 7 but
checkpointing step 6 does not end up with two step-7 rows. Non-finite numbers are written as ``null``
(JSON has no NaN).
"""

from __future__ import annotations

import json
import math
import secrets
from pathlib import Path
from typing import Any

from cadenza.errors import CadenzaError
from cadenza.jsonio import atomic_write_text

WANDB_ID = "wandb-run-id"  # OUT/wandb-run-id: a resumed run continues the same wandb run


def require_wandb() -> None:
    """One line when ``wandb`` is asked for but not installed (checked with the config, before any work)."""
    import importlib.util

    try:
        found = importlib.util.find_spec("wandb") is not None
    except ImportError:
        found = False
    if not found:
        raise CadenzaError(
            "run.wandb = true but the wandb package is not installed; pip install 'cadenza[wandb]' "
            "or set run.wandb = false"
        )


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class MetricsLogger:
    """``enabled=False`` (ranks other than 0 of a distributed run) writes nothing."""

    def __init__(
        self,
        out_dir: str | Path,
        *,
        resume_step: int = 0,
        tensorboard: bool = False,
        enabled: bool = True,
        wandb: bool = False,
        wandb_project: str = "cadenza",
        run_config: dict[str, Any] | None = None,
    ):
        self.path = Path(out_dir) / "metrics.jsonl"
        self.enabled = enabled
        self._tb = None
        self._wandb: Any = None
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
        if wandb:
            self._wandb = _start_wandb(Path(out_dir), wandb_project, run_config or {})

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
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in row.items() if _scalar(v) and k != "step"}, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def _start_wandb(out_dir: Path, project: str, run_config: dict[str, Any]) -> Any:
    """A wandb run under ``OUT/wandb``; the same run id across resumes (its steps continue)."""
    require_wandb()
    import wandb

    id_file = out_dir / WANDB_ID
    run_id = id_file.read_text().strip() if id_file.exists() else secrets.token_hex(4)
    atomic_write_text(id_file, run_id + "\n")
    return wandb.init(
        project=project, dir=str(out_dir), id=run_id, resume="allow", config=run_config, name=out_dir.name
    )


def _scalar(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and v is not None


def _clean(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v
