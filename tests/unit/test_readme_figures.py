"""The README's quickstart figures agree with each other (issue 21: it promised about 0.98 of
the link rate while fresh machines got 0.962 to 0.970, and its own table showed 0.972).
tests/integration/test_run_quickstart.py holds the quoted range against a real run."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def quoted_busbw_range(text: str) -> tuple[float, float]:
    """The range the README quotes: 'reaches about 0.96 to 0.97 of the link rate'."""
    m = re.search(r"reaches about (0\.\d+)(?: to (0\.\d+))? of the link rate", " ".join(text.split()))
    assert m, "the README no longer quotes the quickstart's busbw as 'reaches about X to Y of the link rate'"
    lo = float(m.group(1))
    return lo, float(m.group(2) or lo)


def test_the_quoted_range_holds_the_summary_the_readme_prints():
    text = README.read_text()
    lo, hi = quoted_busbw_range(text)
    shown = float(re.search(r"^ busbw / host link\s+(0\.\d+)$", text, re.M).group(1))
    assert lo <= round(shown, 2) <= hi, (lo, hi, shown)
    assert hi < 0.986  # the RoCE headers' cap, which the README names
