"""Packet spraying on a real fabric: one QP's bytes spread evenly over the uplinks, the receiver
places reordered packets by PSN (no NAK, no resend), OVS's flow cache keeps up, and on the ECMP
collision scenario spraying and DLB finish the flows as fast as if nothing collided."""

from __future__ import annotations

import pytest

from tests.integration.fabric_checks import fabric_emu, only_run_dir, read_csv, read_json, run_shipped

pytestmark = [pytest.mark.root, pytest.mark.slow]

ONE_QP = """\
name: spray-one-qp
topology: {name: ls-4x2x1, kind: leaf-spine, spines: 4, leaves: 2, hosts_per_leaf: 1, dilation: 2000}
load_balancing: spray
workload:
  type: flows
  flows:
    - {src: h1, dst: h2, size: 8MB, start: 0us}
seed: 1
"""


def test_one_queue_pair_puts_a_quarter_of_its_bytes_on_each_of_four_uplinks(tmp_path):
    spec = tmp_path / "spray.yaml"
    spec.write_text(ONE_QP)
    r = fabric_emu("run", str(spec), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = only_run_dir(tmp_path / "out", "spray-one-qp")
    s = read_json(run_dir / "summary.json")
    assert s["status"] == "ok"

    uplinks = {p["peer"]: int(p["tx_bytes"]) for p in read_csv(run_dir / "ports.csv")
               if p["switch"] == "leaf1" and p["kind"] == "fabric"}
    total = sum(uplinks.values())
    assert len(uplinks) == 4 and total > 8_000_000
    for spine, sent in uplinks.items():
        assert 0.20 <= sent / total <= 0.30, uplinks

    (flow,) = read_csv(run_dir / "flows.csv")
    assert int(flow["rx_bytes"]) == 8_000_000
    t = s["transport"]
    # Reordering is never loss: nothing was NAKed or sent again, nothing discarded; packets that
    # arrived early were placed (counted in out_of_order, which may be 0 on a quiet machine).
    assert (t["retransmitted_packets"], t["naks"], t["timeouts"], t["lost_packets"]) == (0, 0, 0, 0)
    assert t["out_of_sequence"] == 0 and t["out_of_order"] >= 0
    assert int(flow["rx_out_of_order"]) == t["out_of_order"]

    # OVS's flow cache: the 4 entropy values are 4 cached flows per direction, not an upcall
    # per packet (the per-run total comes from pmd-stats-show).
    ovs = s["cpu"]["ovs_datapath"]
    assert ovs["packets"] > 4_000 and ovs["upcalls"] < 0.01 * ovs["packets"], ovs


def _flow_completions(run_dir) -> list[float]:
    return [float(f["completion_fabric_us"]) for f in read_csv(run_dir / "flows.csv")]


def test_spray_and_dlb_remove_the_ecmp_collision(tmp_path_factory):
    """experiments/ecmp-collision.yaml: ECMP puts two of four flows on one uplink; spraying
    spreads every flow over all four, DLB gives each new flow the least-loaded uplink."""
    ecmp_dir, r = run_shipped(tmp_path_factory, "ecmp-collision")
    assert r.returncode == 0, r.stdout + r.stderr
    ecmp = read_json(ecmp_dir / "summary.json")
    assert ecmp["ecmp"]["max_qps_per_uplink"] >= 2  # the scenario's promise: ECMP collides
    alone = min(_flow_completions(ecmp_dir))  # a flow that had an uplink to itself
    assert max(_flow_completions(ecmp_dir)) > 1.5 * alone
    for mode in ("spray", "dlb"):
        run_dir, r = run_shipped(tmp_path_factory, "ecmp-collision", f"load_balancing={mode}")
        assert r.returncode == 0, r.stdout + r.stderr
        s = read_json(run_dir / "summary.json")
        assert s["jct_fabric_s"] <= 0.75 * ecmp["jct_fabric_s"], mode
        assert max(_flow_completions(run_dir)) <= 1.15 * alone, mode
        assert s["transport"]["retransmitted_packets"] == 0, mode
        if mode == "dlb":  # one flowlet per flow, each on an uplink of its own, none moved
            ups = s["dlb"]["leaf1"]
            assert sorted(u["flowlets"] for u in ups.values()) == [1, 1, 1, 1], ups
            assert sum(u["moves"] for u in ups.values()) == 0
