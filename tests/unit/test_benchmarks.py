"""The benchmarks that need no root still run: each one's smoke mode exits 0 and prints its
ratios (tests/integration/test_benchmarks.py runs those that build fabrics)."""

from __future__ import annotations

import re

from tests.conftest import run_benchmark


def test_packet_build_prints_a_ratio_per_packet_kind():
    done = run_benchmark("packet_build", timeout_s=60)
    assert done.returncode == 0, done.stdout + done.stderr
    for kind in ("MIDDLE", "FIRST+RETH", "LAST"):
        assert re.search(rf"^{re.escape(kind)} +\d+ +\d+\.\d+ +\d+\.\d+ +\d+\.\dx$", done.stdout, re.M), \
            done.stdout
