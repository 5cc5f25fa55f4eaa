"""Summary math for incast and flows: completion time, goodput, Jain's fairness, flows.csv rows,
and loss vs reordering in the transport totals."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from fabric_emu.run.prepare import load_checked
from fabric_emu.results.summary import build_summary
from fabric_emu.results.table import print_summary
from fabric_emu.results.transport import flow_rows, flows_metrics, jain_index
from fabric_emu.workloads.flows import Flow

D = 2000  # dilation


def test_jain_index():
    assert jain_index([3.0, 3.0, 3.0]) == pytest.approx(1.0)
    assert jain_index([5.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)  # one has it all: 1/n
    assert jain_index([1.0, 2.0, 3.0]) == pytest.approx(36 / 42)
    assert jain_index([0.0, 0.0]) is None and jain_index([]) is None


def send_qp(flow: int, dst: str, qpn: int, first: float, nbytes: int, resent: int = 0) -> dict:
    return {"flow": flow, "dst": dst, "qpn": qpn, "remote_qpn": qpn + 1, "udp_src": 49152 + qpn,
            "bytes": nbytes, "packets": nbytes // 1000 + resent, "retransmitted": resent,
            "naks": 1 if resent else 0, "timeouts": 0, "first_tx": first, "last_tx": first + 1}


def recv_qp(flow: int, src: str, qpn: int, last: float, nbytes: int, discarded: int = 0) -> dict:
    return {"flow": flow, "src": src, "qpn": qpn + 1, "remote_qpn": qpn, "bytes": nbytes,
            "packets": nbytes // 1000, "duplicates": 0, "out_of_sequence": discarded, "ecn_ce": 0,
            "first_rx": last - 1, "last_rx": last}


def incast_agents(resent: int = 0, lost: int = 0) -> dict:
    """h2 and h3 each write 1 MB to h1 (GO at 100): h2 from 100.0 to 101.0, h3 from 100.5 to 102.5.
    h3 sends `resent` packets again after `lost` were lost (the rest were discarded at h1)."""
    return {
        "h1": {"status": "ok", "go": 100.0, "send_qps": [],
               "recv_qps": [recv_qp(0, "h2", 10, 101.0, 1_000_000),
                            recv_qp(1, "h3", 20, 102.5, 1_000_000, resent - lost)]},
        "h2": {"status": "ok", "go": 100.0, "send_qps": [send_qp(0, "h1", 10, 100.0, 1_000_000)], "recv_qps": []},
        "h3": {"status": "ok", "go": 100.0, "send_qps": [send_qp(1, "h1", 20, 100.5, 1_000_000, resent)],
               "recv_qps": []},
    }


def test_completion_goodput_and_fairness():
    flows = [Flow("h2", "h1", 1_000_000), Flow("h3", "h1", 1_000_000)]
    m = flows_metrics(flows, incast_agents(), D)
    assert m["jct_s"] == pytest.approx(2.5) and m["jct_fabric_s"] == pytest.approx(2.5 / D)
    g2, g3 = 8e6 / 1.0 * D / 1e9, 8e6 / 2.0 * D / 1e9  # 16 and 8 Gb/s modelled
    assert [f["goodput_gbps"] for f in m["flows"]] == pytest.approx([g2, g3])
    assert [f["start_s"] for f in m["flows"]] == pytest.approx([0.0, 0.5])
    assert [f["completion_fabric_us"] for f in m["flows"]] == pytest.approx([1e6 / D, 2e6 / D])
    assert m["aggregate_goodput_gbps"] == pytest.approx(16e6 / 2.5 * D / 1e9)
    assert m["jain_fairness"] == pytest.approx((g2 + g3) ** 2 / (2 * (g2 ** 2 + g3 ** 2)))
    assert m["sender_goodput_gbps"] == pytest.approx({"h2": g2, "h3": g3})
    assert (m["goodput_min_gbps"], m["goodput_max_gbps"]) == pytest.approx((g3, g2))


def test_a_sender_with_two_flows_counts_once():
    flows = [Flow("h2", "h1", 1_000_000), Flow("h2", "h3", 1_000_000)]
    agents = {"h2": {"go": 0.0, "send_qps": [send_qp(0, "h1", 1, 0.0, 1_000_000), send_qp(1, "h3", 5, 1.0, 1_000_000)]},
              "h1": {"recv_qps": [recv_qp(0, "h2", 1, 2.0, 1_000_000)]},
              "h3": {"recv_qps": [recv_qp(1, "h2", 5, 4.0, 1_000_000)]}}
    m = flows_metrics(flows, agents, 1)
    assert m["sender_goodput_gbps"] == pytest.approx({"h2": 16e6 / 4.0 / 1e9})
    assert m["jain_fairness"] == pytest.approx(1.0)


def test_no_completion_time_while_a_flow_never_delivered():
    flows = [Flow("h2", "h1", 1_000_000), Flow("h3", "h1", 1_000_000)]
    agents = incast_agents()
    agents["h1"]["recv_qps"].pop()
    m = flows_metrics(flows, agents, D)
    assert "jct_s" not in m and "jain_fairness" not in m
    assert m["flows"][1]["bytes_received"] == 0 and m["flows"][1]["goodput_gbps"] is None


@pytest.fixture
def incast_spec(spec_dir: Path):
    (spec_dir / "exp.yaml").write_text(
        "name: e\ntopology: topo.yaml\nworkload: {type: incast, receiver: h1, senders: [h2, h3], size: 1MB}\n")
    return load_checked(spec_dir / "exp.yaml", [])


def test_incast_summary(incast_spec):
    spec, plan, ranks = incast_spec
    s = build_summary(spec, plan, ranks, {"agents": incast_agents()}, {"status": "ok"})
    assert s["status"] == "ok" and s["workload"] == "incast" and s["ranks"] == 3
    assert s["bytes_planned"] == 2_000_000 and s["transport"]["delivered_fraction"] == 1.0
    assert s["jct_s"] == pytest.approx(2.5) and 0 < s["jain_fairness"] <= 1
    assert s["receiver_link_fraction"] == pytest.approx(s["aggregate_goodput_gbps"] / 100)
    assert len(s["flows"]) == 2 and "busbw_gbps" not in s
    out = Console(file=io.StringIO(), width=120)
    print_summary(out, s, Path("/tmp/run"))
    text = out.file.getvalue()
    assert "Jain fairness" in text and "h3 > h1" in text and "aggregate goodput" in text


def test_loss_shows_as_rc_recovery(incast_spec):
    spec, plan, ranks = incast_spec
    s = build_summary(spec, plan, ranks, {"agents": incast_agents()}, {"status": "ok"})
    assert s["status"] == "ok" and s["transport"]["lost_packets"] == 0
    s = build_summary(spec, plan, ranks, {"agents": incast_agents(resent=7, lost=2)}, {"status": "ok"})
    tr = s["transport"]
    assert s["status"] == "ok"  # RC repaired the loss: every byte arrived
    assert (tr["lost_packets"], tr["retransmitted_packets"], tr["out_of_sequence"], tr["naks"]) == (2, 7, 5, 1)
    assert tr["by_host"]["h3"]["retransmitted"] == 7


def test_flow_rows_have_completion_and_goodput():
    from fabric_emu.spec.topology import TopologySpec
    from fabric_emu.topo.plan import build_plan

    plan = build_plan(TopologySpec(name="t", kind="leaf-spine", spines=1, leaves=2, hosts_per_leaf=2))
    rows = {r["src"]: r for r in flow_rows(plan, incast_agents())}
    h3 = rows["h3"]
    assert (h3["flow"], h3["dst"], h3["rx_bytes"]) == (1, "h1", 1_000_000)
    assert h3["start_s"] == pytest.approx(0.5) and h3["completion_s"] == pytest.approx(2.0)
    assert h3["completion_fabric_us"] == pytest.approx(2.0 / D * 1e6)
    assert h3["goodput_gbps"] == pytest.approx(1e6 * 8 / 2.0 * D / 1e9)
