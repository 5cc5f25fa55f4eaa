"""ECMP spreads queue pairs by UDP source port: 8 QPs between two leaves use >= 3 of 4 uplinks."""

from __future__ import annotations

import pytest

from tests.integration.fabric_checks import fabric_emu, only_run_dir, read_csv, read_json

pytestmark = [pytest.mark.root, pytest.mark.slow]

EXPERIMENT = """\
name: ecmp-spread
topology: {name: ls-4x2x1, kind: leaf-spine, spines: 4, leaves: 2, hosts_per_leaf: 1, dilation: 2000}
workload: {type: allreduce, size: 4MB, iterations: 1, ranks: [h1, h2], qps_per_peer: 8}
seed: 1
"""


def test_eight_qps_spread_over_the_uplinks(tmp_path):
    spec = tmp_path / "ecmp.yaml"
    spec.write_text(EXPERIMENT)
    r = fabric_emu("run", str(spec), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = only_run_dir(tmp_path / "out", "ecmp-spread")
    assert read_json(run_dir / "summary.json")["status"] == "ok"

    ports = read_csv(run_dir / "ports.csv")
    uplinks = {p["peer"]: int(p["tx_bytes"]) for p in ports
               if p["switch"] == "leaf1" and p["kind"] == "fabric"}
    total = sum(uplinks.values())
    used = {spine for spine, b in uplinks.items() if b > 0.05 * total}
    assert len(uplinks) == 4 and total > 4_000_000
    assert len(used) >= 3, uplinks

    # The counters agree with the path OVS chose for each QP (its UDP source port decides).
    flows = [f for f in read_csv(run_dir / "flows.csv") if f["src"] == "h1"]
    assert len(flows) == 8 and len({f["udp_src"] for f in flows}) == 8
    assert {f["uplink"] for f in flows} == used
