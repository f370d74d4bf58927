"""Per-node results from pytest's JUnit XML, keyed back to node IDs.

pytest writes ``classname``/``name`` by mangling the node ID (path separators to dots, ``.py``
dropped, the last ``::`` part as the name); mangling the expected IDs the same way finds them.
A node ID absent from the report is ``missing``, which grading counts as failed.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

_RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}


def mangle(nodeid: str) -> tuple[str, str]:
    path, bracket, params = nodeid.partition("[")
    names = path.split("::")
    names[0] = re.sub(r"\.py$", "", names[0].replace("/", "."))
    names[-1] += bracket + params
    return ".".join(names[:-1]), names[-1]


def parse_junit(path: Path) -> dict[tuple[str, str], str]:
    """(classname, name) -> passed/failed/error/skipped; the worst status wins for repeated entries."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return {}
    results: dict[tuple[str, str], str] = {}
    for case in root.iter("testcase"):
        key = (case.get("classname", ""), case.get("name", ""))
        tags = {child.tag for child in case}
        status = (
            "error"
            if "error" in tags
            else "failed"
            if "failure" in tags
            else "skipped"
            if "skipped" in tags
            else "passed"
        )
        prev = results.get(key)
        if prev is None or _RANK[status] > _RANK[prev]:
            results[key] = status
    return results


def node_statuses(nodeids: list[str], report: dict[tuple[str, str], str]) -> dict[str, str]:
    return {nid: report.get(mangle(nid), "missing") for nid in nodeids}
