"""DLB (flowlet switching) on a real fabric, from the flowlet stage's own counters: a new flow
avoids the uplinks other flows keep busy, a continuous flow never moves, and a flow that pauses
longer than dlb.inactivity starts a new flowlet (it may move) without any packet arriving out
of order."""

from __future__ import annotations

import pytest

from tests.integration.fabric_checks import fabric_emu, only_run_dir, read_csv, read_json

pytestmark = [pytest.mark.root, pytest.mark.slow]

FABRIC = "{name: ls-4x2x4, kind: leaf-spine, spines: 4, leaves: 2, hosts_per_leaf: 4, dilation: 4000}"


def run(tmp_path, flows: str) -> dict:
    spec = tmp_path / "dlb.yaml"
    spec.write_text(f"name: dlb\ntopology: {FABRIC}\nload_balancing: dlb\n"
                    f"dlb: {{inactivity: 50us, quality_window: 20us}}\n"
                    f"workload:\n  type: flows\n  flows:\n{flows}seed: 1\n")
    r = fabric_emu("run", str(spec), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = only_run_dir(tmp_path / "out", "dlb")
    s = read_json(run_dir / "summary.json")
    assert s["status"] == "ok"
    s["_ports"] = read_csv(run_dir / "ports.csv")
    return s


def test_new_flows_avoid_busy_uplinks_and_continuous_flows_never_move(tmp_path):
    # h1's flow keeps one uplink busy from the start; each later flow arrives while the earlier
    # ones still run, and must take an uplink nobody uses.
    s = run(tmp_path, "".join(f"    - {{src: h{i}, dst: h{i + 4}, size: 8MB, start: {100 * (i - 1)}us}}\n"
                             for i in range(1, 5)))
    ups = s["dlb"]["leaf1"]
    assert sorted(u["flowlets"] for u in ups.values()) == [1, 1, 1, 1], ups
    assert sum(u["moves"] for u in ups.values()) == 0, ups  # no gap, no move
    sent = {p["peer"]: int(p["tx_bytes"]) for p in s["_ports"] if p["switch"] == "leaf1" and p["kind"] == "fabric"}
    assert all(b > 7_000_000 for b in sent.values()), sent  # each flow had an uplink to itself
    assert s["transport"]["out_of_sequence"] == 0


def test_a_flow_that_pauses_longer_than_the_inactivity_starts_new_flowlets_in_order(tmp_path):
    # h1 -> h5 sends 4 x 2 MB with 200 us idle between them (> 50 us inactivity); h2 -> h6
    # runs throughout and keeps one uplink loaded, so new flowlets see unequal loads.
    s = run(tmp_path, "    - {src: h2, dst: h6, size: 16MB, start: 0us}\n"
                      "    - {src: h1, dst: h5, size: 2MB, iterations: 4, gap: 200us, start: 50us}\n")
    ups = s["dlb"]["leaf1"]
    assert sum(u["flowlets"] for u in ups.values()) == 1 + 4, ups  # h2's one, and one per burst
    busy = max(ups, key=lambda spine: ups[spine]["bytes"])  # h2's 16 MB
    assert ups[busy]["flowlets"] == 1, ups  # no burst of h1's chose the uplink h2 kept busy
    t = s["transport"]
    assert (t["out_of_sequence"], t["naks"], t["retransmitted_packets"]) == (0, 0, 0), t
    assert t["delivered_fraction"] == 1.0
