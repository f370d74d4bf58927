"""The trusted side of the result channel: set up before the run, verified after it.

A channel is a fresh directory outside the workspace holding the plugin file, ``config.json`` (node
selection and which checks are on), ``key`` (a per-run random key the plugin reads and deletes at
import) and, after the run, ``results.jsonl``. :func:`read_channel` accepts a record only with a valid
HMAC and the next sequence number, requires the plugin's final record, and cross-checks the reported
node IDs against the requested ones: a forged, reordered, duplicated or unknown record is tampering.
"""

from __future__ import annotations

import ast
import hashlib
import hmac
import json
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path

PLUGIN_FILE = Path(__file__).with_name("plugin.py")  # copied, never imported by the parent
PLUGIN_MODULE = "_cadenza_testrun_plugin"
DIR_ENV = "CADENZA_TESTRUN_DIR"


def plugin_report_hooks() -> frozenset[str]:
    """The plugin's ``REPORT_HOOKS`` (the hooks that decide a test's outcome), read from its source: the
    plugin imports nothing from cadenza and is never imported here, so its file is the one owner."""
    for node in ast.parse(PLUGIN_FILE.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "REPORT_HOOKS" for t in node.targets):
            return frozenset(ast.literal_eval(node.value))
    raise AssertionError(f"{PLUGIN_FILE} defines no REPORT_HOOKS")


@dataclass(kw_only=True)
class Checks:
    """Switches for each check of the verdict (all on; turned off one at a time only by mutation tests)."""

    mac: bool = True  # reject records without a valid per-run HMAC and sequence number
    node_ids: bool = True  # unknown or duplicated node IDs are tampering
    end_record: bool = True  # a run that exits 0 without the plugin's final record is tampering
    integrity: bool = True  # the plugin's snapshot of the runner machinery and its reporting hooks
    call_vs_report: bool = True  # a test whose call raised but whose report says passed


@dataclass(kw_only=True)
class ChannelResult:
    outcomes: dict[str, str] = field(default_factory=dict)
    collect_errors: list[str] = field(default_factory=list)
    tampering: list[str] = field(default_factory=list)
    complete: bool = False  # the plugin's final record arrived
    cpu_s: float = 0.0  # CPU seconds the test process reported (its children included)


class Channel:
    """One run's channel directory (created empty by the caller, e.g. bound read-write in the sandbox)."""

    def __init__(
        self, directory: Path, *, select: list[str] | None, cov_context: bool = False, checks: Checks
    ) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.checks = checks
        self.select = list(select) if select is not None else None
        self._key = secrets.token_bytes(32)
        shutil.copyfile(PLUGIN_FILE, self.dir / f"{PLUGIN_MODULE}.py")
        config = {"select": self.select, "cov_context": cov_context, "checks": vars(checks)}
        (self.dir / "config.json").write_text(json.dumps(config))
        (self.dir / "key").write_bytes(self._key)

    @property
    def results(self) -> Path:
        return self.dir / "results.jsonl"

    def read(self, *, exit_code: int | None) -> ChannelResult:
        return read_channel(
            self.results, self._key, requested=self.select, checks=self.checks, exit_code=exit_code
        )


def read_channel(
    path: Path, key: bytes, *, requested: list[str] | None, checks: Checks, exit_code: int | None
) -> ChannelResult:
    """Verify and decode the records in ``path`` (see module docstring)."""
    res = ChannelResult()
    try:
        lines = path.read_bytes().splitlines()
    except OSError:
        lines = []
    expected_seq = 0
    seen: set[str] = set()
    wanted = set(requested) if requested is not None else None
    for i, raw in enumerate(lines):
        try:
            frame = json.loads(raw)
            seq, body, mac = frame["seq"], frame["body"], frame["mac"]
            rec = json.loads(body)
        except (ValueError, KeyError, TypeError):
            if i < len(lines) - 1 and checks.mac:  # only the last line may be cut by a kill
                res.tampering.append(f"unreadable record {i + 1} in the result channel")
            continue
        if checks.mac:
            good = hmac.new(key, f"{seq}:{body}".encode(), hashlib.sha256).hexdigest()
            if not hmac.compare_digest(str(mac), good) or seq != expected_seq:
                res.tampering.append(f"record {i + 1} is not authentic (forged or reordered)")
                continue
        expected_seq += 1
        kind = rec.get("kind")
        if kind == "collect_error":
            res.collect_errors.append(str(rec.get("nodeid")))
        elif kind == "test":
            nid = str(rec.get("nodeid"))
            if checks.node_ids and nid in seen:
                res.tampering.append(f"node {nid} reported twice")
            if checks.node_ids and wanted is not None and nid not in wanted:
                res.tampering.append(f"node {nid} was not requested")
            seen.add(nid)
            res.outcomes[nid] = str(rec.get("outcome"))
        elif kind == "end":
            res.complete = True
            res.cpu_s = float(rec.get("cpu_s") or 0.0)
            res.tampering.extend(str(t) for t in rec.get("tamper") or [])
    if checks.end_record and not res.complete and exit_code == 0:
        res.tampering.append("the test process exited with status 0 before the runner's final record")
    return res
