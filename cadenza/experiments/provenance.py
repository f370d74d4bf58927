"""Where an experiment's numbers come from: the code version, the settings, the time spent.

* :func:`code_version`: the git commit of the cadenza checkout that runs, and whether its tree was dirty;
* :func:`settings_digest`: a short hash of the pinned settings (every (arm, seed) result carries it);
* :class:`Invocations`: ``provenance.json`` in the output directory, one entry per invocation (code,
  start, wall time), so a resumed run reports its *full* wall time and every code version it ran under;
* :func:`check_results`: one line naming the first difference when results would be mixed (another
  code version, other settings, an interrupted run).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from pathlib import Path
from typing import Any

from cadenza.errors import CadenzaError
from cadenza.jsonio import atomic_write_json

_REPO = Path(__file__).resolve().parents[2]


def code_version() -> dict[str, Any]:
    """``{"commit": sha or "unknown", "dirty": bool | None}`` of the checkout this code runs from."""

    def git(*args: str) -> str | None:
        try:
            res = subprocess.run(["git", "-C", str(_REPO), *args], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return res.stdout if res.returncode == 0 else None

    sha = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    dirty = None if status is None else bool(status.strip())
    return {"commit": sha.strip() if sha else "unknown", "dirty": dirty}


def settings_digest(settings: dict[str, Any], drop: tuple[str, ...] = ("arms",)) -> str:
    """A 12-hex digest of the settings that pin a run (selections such as ``arms`` left out)."""
    kept = {k: v for k, v in settings.items() if k not in drop}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:12]


class Invocations:
    """``provenance.json``: every invocation on one output directory, its code version and wall time."""

    def __init__(self, out: Path, *, allow_code_change: bool = False) -> None:
        self.path = out / "provenance.json"
        self.entries: list[dict[str, Any]] = (
            json.loads(self.path.read_text())["invocations"] if self.path.exists() else []
        )
        self.code = code_version()
        ran = {e["code"]["commit"] for e in self.entries}
        if ran - {self.code["commit"]} and not allow_code_change:
            raise CadenzaError(
                f"--out {str(out)!r} was run by code {', '.join(sorted(c[:10] for c in ran))}, this is "
                f"{self.code['commit'][:10]}; rerun with that code to resume, pass --allow-code-change to "
                "mix (recorded), or pass another --out"
            )
        self.t0 = time.time()
        self.entries.append({"code": self.code, "started": round(self.t0, 1), "wall_s": 0.0})
        self.save()

    def save(self) -> None:
        self.entries[-1]["wall_s"] = round(time.time() - self.t0, 1)
        atomic_write_json(self.path, {"invocations": self.entries})

    @property
    def wall_s_total(self) -> float:
        return round(sum(e["wall_s"] for e in self.entries), 1)

    @property
    def commits(self) -> list[str]:
        return sorted({e["code"]["commit"] for e in self.entries})


def check_results(
    runs: dict[str, list[dict[str, Any]]], digest: str, steps: int, control_stops: bool
) -> None:
    """One-line error if a run of ``runs`` has other settings or stopped before ``steps`` (interrupted);
    the supervised control may stop early when ``control_stops``."""
    for arm, rs in runs.items():
        for r in rs:
            where = f"{arm} seed {r['seed']}"
            if r.get("settings_digest", digest) != digest:
                raise CadenzaError(
                    f"{where} was run with other settings (digest {r['settings_digest']}, now {digest}); "
                    "remove its run directory to rerun it, or report it from its own --out"
                )
            if r["steps"] < steps and not (arm == "supervised" and control_stops):
                raise CadenzaError(
                    f"{where} stopped at step {r['steps']} of {steps} (interrupted); rerun to finish it"
                )
