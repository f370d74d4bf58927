"""Benchmark figures come from one source: every figure the README and docs quote with a ``bench``
marker equals its value in ``bench/results/*.json``, and the README's "Measured" table quotes no number
without one (``tests/support/figures.py`` describes the marker)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.support.figures import MARK, check, matches, unmarked, value

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_quoted_figure_equals_its_json() -> None:
    bad = [line for page in PAGES for line in check(page.read_text(), RESULTS, page.name)]
    assert not bad, "figures that disagree with bench/results:\n" + "\n".join(bad)
    quoted = sum(len(MARK.findall(page.read_text())) for page in PAGES)
    assert quoted >= 40  # the markers are really there (README table, engines, async, scale, muon)


def test_the_readme_measured_table_quotes_only_marked_figures() -> None:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Measured") : text.index("\n## ", text.index("## Measured") + 3)]
    rows = [r for r in section.splitlines() if r.startswith("| ") and not r.startswith(("| what", "| ---"))]
    assert len(rows) >= 5
    loose = {r.split("|")[1].strip(): unmarked(r.split("|")[2]) for r in rows}
    assert not any(loose.values()), (
        f"numbers without a bench marker: { {k: v for k, v in loose.items() if v} }"
    )


def test_the_check_catches_a_changed_figure(tmp_path) -> None:
    (tmp_path / "r.json").write_text(
        json.dumps({"a": {"b.c": [1.0, 178.94]}, "k": {"0": 130.02, "1": 220.99}})
    )
    assert value(tmp_path, "r.json", "a.b.c.1") == 178.94
    good = "179<!-- bench r.json a.b.c.1 --> and 1.70<!-- bench r.json k.1/k.0 -->x"
    assert check(good, tmp_path) == []
    wrong = (
        "178<!-- bench r.json a.b.c.1 --> and 1.33<!-- bench r.json k.1/k.0 -->x, 9<!-- bench r.json a.zz -->"
    )
    found = check(wrong, tmp_path, "README.md")
    assert len(found) == 3 and "is 178.94" in found[0] and "missing" in found[2], found
    assert matches("1847", 1846.5) and matches("0.040", 0.04) and not matches("0.037", 0.04)
    assert unmarked("214<!-- bench r.json a --> vs 179 (SmolLM2-135M, K=1)") == ["179"]
    assert re.search(MARK, good)
