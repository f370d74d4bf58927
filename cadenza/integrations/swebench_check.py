"""SWE-bench's own code reading cadenza's output (run in the ecosystem venv, where ``swebench`` lives).

``instances RECORDS.jsonl``: the records of ``cadenza tasks export --format swebench`` loaded with
``swebench.harness.utils.load_swebench_dataset`` and checked field by field against
``swebench.types.SWEbenchInstance`` (every declared key, with its declared type; ``FAIL_TO_PASS`` and
``PASS_TO_PASS`` are JSON-encoded lists, as in SWE-bench's datasets). ``parse LOG``: the per-test
statuses ``swebench.harness.log_parsers.python.parse_log_pytest`` reads from a ``pytest -rA`` log.
Each prints one JSON object per file it is given, one per line (several files: one interpreter start,
which imports SWE-bench once).
"""

from __future__ import annotations

import argparse
import json
import typing
from pathlib import Path
from typing import Any


def instance_problems(record: dict[str, Any]) -> list[str]:
    """What keeps ``record`` from being a ``SWEbenchInstance`` (empty: it is one)."""
    from swebench.types import SWEbenchInstance

    problems = []
    for key, kind in typing.get_type_hints(SWEbenchInstance).items():
        if key not in record:
            problems.append(f"missing {key}")
        elif not isinstance(record[key], kind):
            problems.append(f"{key} is {type(record[key]).__name__}, SWEbenchInstance says {kind.__name__}")
    for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        try:
            tests = json.loads(record.get(key, ""))
        except (TypeError, ValueError):
            tests = None
        if not (isinstance(tests, list) and all(isinstance(t, str) for t in tests)):
            problems.append(f"{key} does not decode to a list of test ids")
    return problems


def check_instances(path: Path) -> dict[str, Any]:
    from swebench.harness.utils import load_swebench_dataset

    records = load_swebench_dataset(str(path))
    problems = {r["instance_id"]: p for r in records if (p := instance_problems(dict(r)))}
    return {"checked": len(records), "problems": problems}


def parse_pytest_log(log: str) -> dict[str, str]:
    from swebench.harness.log_parsers.python import parse_log_pytest

    return parse_log_pytest(log, None)  # the pytest parser never reads the test spec


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    sub.add_parser("instances").add_argument("records", type=Path, nargs="+")
    sub.add_parser("parse").add_argument("log", type=Path, nargs="+")
    args = ap.parse_args(argv)
    if args.what == "instances":
        for path in args.records:
            print(json.dumps(check_instances(path)))
    else:
        for path in args.log:
            print(json.dumps(parse_pytest_log(path.read_text(errors="replace"))))


if __name__ == "__main__":
    main()
