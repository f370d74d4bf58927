"""The trusted side of the result channel: set up before the run, judged after it.

A channel is a fresh directory outside the workspace holding the runner's three files (:mod:`boot`,
:mod:`guard`, :mod:`plugin`, copied, never imported by the parent), ``config.json`` (the node ids
the parent chose, per-run random module names, the guard's allowances) and, after the run,
``results.jsonl``. No secret is given to the test process: it runs the agent's code, and nothing it
holds can be kept from that code. What counts as evidence is decided here, from what the parent
fixed beforehand: records numbered from 0 with nothing after the final one, each requested node at
most once and no other, the plugin's final record before a clean exit, the guard's exit status.
"""

from __future__ import annotations

import ast
import json
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).parent
RUNNER_FILES = ("boot.py", "guard.py", "guard_rules.py", "plugin.py")  # copied, never imported by the parent
PLUGIN_FILE = HERE / "plugin.py"
GUARD_EXIT = 86  # cadenza.testrun.guard.GUARD_EXIT (the guard imports nothing, so it is repeated here)
#: the fixed name of the old ``-p`` loading, kept only for the mutation test of ``by_path``
LEGACY_PLUGIN_MODULE = "_cadenza_testrun_plugin"


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

    sequence: bool = True  # records numbered 0, 1, ...; only the last may be cut; none after the end
    node_ids: bool = True  # unknown or duplicated node IDs are tampering
    end_record: bool = True  # a run that exits 0 without the plugin's final record is tampering
    integrity: bool = True  # the plugin's end-of-session snapshot of the runner machinery and its hooks
    integrity_per_test: bool = True  # the critical part of that snapshot checked after every test
    call_vs_report: bool = True  # a test whose call raised but whose report says passed
    guard: bool = True  # the audit hook that ends the process when workspace code reaches for it
    by_path: bool = True  # the runner loaded by file path under a random name (off: ``-p`` by a fixed name)
    trusted_roots: bool = True  # the guard trusts code only from real files under read-only roots
    plugins_first: bool = True  # the env's pytest11 plugins imported before the workspace is on sys.path


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
        self,
        directory: Path,
        *,
        select: list[str] | None,
        cov_context: bool = False,
        checks: Checks,
        test_paths: list[str] | None = None,
        allow: dict[str, list[str]] | None = None,
        reverse: bool = False,
        plugins: list[str] | None = None,
    ) -> None:
        self.dir = Path(directory).absolute()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.checks = checks
        self.select = list(select) if select is not None else None
        for name in RUNNER_FILES:
            shutil.copyfile(HERE / name, self.dir / name)
        if not checks.by_path:
            shutil.copyfile(PLUGIN_FILE, self.dir / f"{LEGACY_PLUGIN_MODULE}.py")
        token = secrets.token_hex(8)  # not a secret: only a name no workspace file can have chosen
        config = {
            "select": self.select,
            "reverse": reverse,
            "cov_context": cov_context,
            "checks": vars(checks),
            "results": str(self.results),
            "plugin_name": f"_cz_plugin_{token}",
            "guard_name": f"_cz_guard_{token}",
            "plugins": list(plugins or []) if checks.plugins_first else [],
            "guard": {"test_paths": list(test_paths or []), "allow": dict(allow or {})},
        }
        (self.dir / "config.json").write_text(json.dumps(config))

    @property
    def results(self) -> Path:
        return self.dir / "results.jsonl"

    @property
    def boot(self) -> Path:
        return self.dir / "boot.py"

    def read(self, *, exit_code: int | None) -> ChannelResult:
        return read_channel(self.results, requested=self.select, checks=self.checks, exit_code=exit_code)


def read_channel(
    path: Path, *, requested: list[str] | None, checks: Checks, exit_code: int | None
) -> ChannelResult:
    """Judge the records in ``path`` (see module docstring)."""
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
            rec = json.loads(raw)
            seq = rec["seq"]
        except (ValueError, KeyError, TypeError):
            if i < len(lines) - 1 and checks.sequence:  # only the last line may be cut by a kill
                res.tampering.append(f"unreadable record {i + 1} in the result channel")
            continue
        if checks.sequence and (seq != expected_seq or res.complete):
            what = "after the final record" if res.complete else "out of sequence"
            res.tampering.append(f"record {i + 1} is {what} (forged or replayed)")
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
        elif kind == "guard":
            res.tampering.append(
                f"the guard ended the test process: {rec.get('capability')} ({rec.get('event')}) "
                f"at {rec.get('where')}"
            )
        elif kind == "end":
            res.complete = True
            res.cpu_s = float(rec.get("cpu_s") or 0.0)
            res.tampering.extend(str(t) for t in rec.get("tamper") or [])
    if exit_code == GUARD_EXIT and not any("guard ended" in t for t in res.tampering):
        res.tampering.append(f"the test process exited with the guard's status {GUARD_EXIT}")
    if checks.end_record and not res.complete and exit_code == 0:
        res.tampering.append("the test process exited with status 0 before the runner's final record")
    return res
