"""Two flows forced onto one uplink overflow its egress buffer: every lost packet is counted.

One spine, ranks ordered h1 h3 h2 h4: h1->h3 and h2->h4 share leaf1's only uplink, h3->h2 and
h4->h1 share leaf2's, each at twice its rate. PFC and DCQCN are off, so RoCE is a lossy class: RC
go-back-N resends what the queues drop and the run completes. What matters is conservation:
packets sent (retransmissions included) = packets that reached a receiver + dropped by the
switches.
"""

from __future__ import annotations

import json

import pytest

from tests.integration.fabric_checks import fabric_emu, only_run_dir, read_csv, read_json

pytestmark = [pytest.mark.root, pytest.mark.slow]

EXPERIMENT = """\
name: collide
topology: {name: ls-1x2x2, kind: leaf-spine, spines: 1, leaves: 2, hosts_per_leaf: 2,
           dilation: 4000, port_buffer: 256KB}
workload: {type: allreduce, size: 4MB, iterations: 1, ranks: [h1, h3, h2, h4]}
pfc: {enabled: false}
congestion_control: none   # DCQCN would slow the senders enough to avoid the overflow
transport: {retransmit_timeout: 262.144us}   # lossy: no pause holds a packet, a short timer is safe
"""


def test_overflow_drops_are_counted_at_the_egress_queue(tmp_path):
    spec = tmp_path / "collide.yaml"
    spec.write_text(EXPERIMENT)
    r = fabric_emu("run", str(spec), "--out", str(tmp_path / "out"))
    run_dir = only_run_dir(tmp_path / "out", "collide")
    s = read_json(run_dir / "summary.json")
    # Data was lost and RC sent it again: the collective completed, every byte delivered.
    assert r.returncode == 0 and s["status"] == "ok", s.get("error")
    assert s["transport"]["delivered_fraction"] == 1.0
    assert s["transport"]["retransmitted_packets"] >= s["switch"]["drops"] > 0
    ports = read_csv(run_dir / "ports.csv")
    uplink_drops = sum(int(p["drops_p3"]) for p in ports
                       if p["switch"].startswith("leaf") and p["kind"] == "fabric")
    assert uplink_drops > 100, ports  # 2:1 overload for seconds overflows 256 KB
    assert all(int(p["queue_drops_p3"]) == 0 for p in ports)  # the port program drops first
    assert s["ecmp"]["max_qps_per_uplink"] == 2  # the collision, as the summary reports it

    agents = [json.loads(f.read_text()) for f in (run_dir / "agents").glob("*.json")]
    sent = sum(q["packets"] for a in agents for q in a["send_qps"])
    # everything that reached a receiver: accepted, or discarded there (duplicate, out of sequence)
    received = sum(q["packets"] + q["duplicates"] + q["out_of_sequence"] for a in agents for q in a["recv_qps"])
    # Nothing vanished uncounted. Not exact: go-back-N resends may still be in flight when the
    # NICs stop.
    assert received + s["switch"]["drops"] == pytest.approx(sent, rel=0.01)
    # A drop at the port program no longer makes OVS discard the rest of its send batch
    # (TC_ACT_STOLEN, bpf/port.c): every lost packet is a counted drop.
    assert s["transport"]["unexplained_loss_packets"] == 0
    assert s["fidelity"]["trusted"]
    assert uplink_drops >= 0.95 * s["switch"]["drops"]  # the overloaded queues, nowhere else

    # The configured buffer is the real one: overloaded queues fill it, and never exceed it.
    limit = 256_000
    uplink_peak = [int(p["max_backlog_bytes"]) for p in ports
                   if p["switch"].startswith("leaf") and p["kind"] == "fabric"]
    assert all(0.75 * limit <= peak <= limit for peak in uplink_peak), uplink_peak
    samples = read_csv(run_dir / "queues.csv")
    assert max(int(r["backlog_bytes"]) for r in samples) <= limit
    assert len({r["t_s"] for r in samples}) >= 5  # a time series, not one snapshot

