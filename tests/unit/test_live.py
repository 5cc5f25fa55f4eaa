"""Live view and Prometheus exporter, from fake snapshots: rates from counter deltas, the metric
families, the JSON round trip, top's rendering, and the agent's once-a-second publisher."""

from __future__ import annotations

import json
import urllib.request
from types import SimpleNamespace

import pytest
from prometheus_client.core import CollectorRegistry
from prometheus_client.exposition import generate_latest
from rich.console import Console

from fabric_emu.nic.live import LivePublisher
from fabric_emu.live.exporter import MetricsServer, SnapshotCollector, metric_families
from fabric_emu.live.manifest import LiveManifest, LivePort
from fabric_emu.live.reader import final_row
from fabric_emu.live.snapshot import PortSample, QpSample, Snapshot, busiest_qps, port_rates, totals
from fabric_emu.live.top import json_view, render


def port(tx: int, rx: int = 0, marks: int = 0, gbps: float = 100.0, **extra) -> PortSample:
    counters = {"tx_bytes": tx, "rx_bytes": rx, "tx_packets": tx // 1000, "rx_packets": rx // 1000,
                "drops": 2, "ecn_marked": marks, "ecn_marked_p3": marks, "pause_tx_p3": 4, "pause_rx_p3": 1,
                "paused_fabric_us_p3": 12.5, **extra}
    return PortSample("leaf1", 3, "leaf1-eth3", "spine1", "fabric", gbps, counters,
                      {0: 0, 3: 15000, 6: 0}, {0: False, 3: True, 6: False})


def snap(taken: float, tx: int, rx: int = 0, marks: int = 0, baseline: bool = True, qps=None) -> Snapshot:
    return Snapshot(run_id="r1", experiment="incast", taken=taken, phase="traffic", dilation=2000.0,
                    go=100.0, load_balancing="ecmp", congestion_control="dcqcn",
                    ports=[port(tx, rx, marks)], qps=qps or [],
                    fidelity={"cpu_busy": 0.5, "cpu_saturated": False, "ovs_thread_busy": 0.4, "saturated": False}, baseline=baseline)


def qp(host: str, bps: float, qpn: int = 0x11) -> QpSample:
    return QpSample(host, qpn, "h1", 49152, 1_000_000, 900_000, 250, 3, 7, bps, 40e9, ecn_ce=9, cnp_sent=7)


def test_port_rate_is_modelled_gbps_from_deltas():
    # 6.25 MB in 2 emulated seconds = 25 Mb/s emulated; x2000 = 50 Gb/s modelled, half a 100G link
    r = port_rates(snap(100.0, 0), snap(102.0, 6_250_000, rx=1_250_000, marks=10))["leaf1-eth3"]
    assert r.tx_gbps == pytest.approx(50.0)
    assert r.rx_gbps == pytest.approx(10.0)
    assert r.tx_util == pytest.approx(0.5)
    assert r.ecn_per_s == pytest.approx(5.0)


def test_no_rate_across_a_baseline_change_or_zero_interval():
    assert port_rates(snap(100.0, 5000, baseline=False), snap(101.0, 10)) == {}
    assert port_rates(snap(100.0, 0), snap(100.0, 10)) == {}
    assert port_rates(snap(100.0, 5000), snap(101.0, 10)) == {}  # went down: no rate for it


def test_modelled_time_and_busiest_qps():
    s = snap(104.0, 0, qps=[qp("h2", 1e6, 1), qp("h3", 3e6, 2), qp("h4", 2e6, 3)])
    assert s.emulated_s == 4.0 and s.modelled_s == pytest.approx(0.002)
    assert [q.host for q in busiest_qps(s, 2)] == ["h3", "h4"]
    assert totals(s)["pause_tx_p3"] == 4


def test_snapshot_json_round_trip():
    s = snap(101.0, 123, qps=[qp("h2", 1e6)])
    back = Snapshot.from_dict(json.loads(json.dumps(s.to_dict())))
    assert back == s


def _samples(s: Snapshot) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in metric_families(s):
        for smp in fam.samples:
            out[(smp.name, tuple(sorted(smp.labels.items())))] = smp.value
    return out


def test_metric_families_names_labels_and_values():
    m = _samples(snap(101.0, 6_250_000, rx=77, marks=10, qps=[qp("h2", 1e6)]))
    lab = (("peer", "spine1"), ("port", "3"), ("switch", "leaf1"))
    assert m[("fabric_emu_port_transmit_bytes_total", lab)] == 6_250_000
    assert m[("fabric_emu_port_receive_bytes_total", lab)] == 77
    assert m[("fabric_emu_port_dropped_packets_total", lab)] == 2
    assert m[("fabric_emu_queue_depth_bytes", (*lab[:2], ("priority", "3"), lab[2]))] == 15000
    assert m[("fabric_emu_ecn_marked_packets_total", (*lab[:2], ("priority", "3"), lab[2]))] == 10
    assert m[("fabric_emu_pfc_pause_frames_total",
              (("direction", "tx"), *lab[:2], ("priority", "3"), lab[2]))] == 4
    assert m[("fabric_emu_pfc_paused", (*lab[:2], ("priority", "3"), lab[2]))] == 1.0
    assert m[("fabric_emu_pfc_paused_modelled_seconds_total", (*lab[:2], ("priority", "3"), lab[2]))] == 12.5e-6
    q = (("dst", "h1"), ("host", "h2"), ("qpn", "17"), ("udp_src", "49152"))
    assert m[("fabric_emu_qp_transmit_rate_modelled_bits_per_second", q)] == 2e9
    assert m[("fabric_emu_qp_cnp_received_total", q)] == 7
    assert m[("fabric_emu_qp_cnp_sent_total", q)] == 7
    assert m[("fabric_emu_dilation", ())] == 2000.0
    assert m[("fabric_emu_modelled_seconds", ())] == pytest.approx(0.0005)
    assert m[("fabric_emu_fidelity_saturated", ())] == 0.0
    assert m[("fabric_emu_run_info", (("congestion_control", "dcqcn"), ("experiment", "incast"),
                                      ("load_balancing", "ecmp"), ("phase", "traffic"), ("run_id", "r1")))] == 1


def test_no_counters_before_the_baseline():
    names = {n for n, _ in _samples(snap(101.0, 5, baseline=False))}
    assert "fabric_emu_queue_depth_bytes" in names
    assert not any(n.startswith("fabric_emu_port_transmit") for n in names)


def test_collector_freezes_and_exposition_parses():
    reads = []

    def source():
        reads.append(1)
        return snap(101.0, len(reads))

    c = SnapshotCollector(source)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(c)
    assert b"fabric_emu_port_transmit_bytes_total" in generate_latest(reg)
    c.freeze(snap(102.0, 999))
    text = generate_latest(reg).decode()
    assert 'fabric_emu_port_transmit_bytes_total{peer="spine1",port="3",switch="leaf1"} 999.0' in text
    assert len(reads) == 1


def test_metrics_server_binds_loopback():
    server = MetricsServer(lambda: snap(101.0, 42), 0)
    try:
        assert server.url.startswith("http://127.0.0.1:")
        body = urllib.request.urlopen(server.url, timeout=5).read().decode()
        assert 'fabric_emu_port_transmit_bytes_total{peer="spine1",port="3",switch="leaf1"} 42.0' in body
    finally:
        server.stop()


def test_top_renders_and_json_view():
    prev, cur = snap(100.0, 0), snap(101.0, 6_250_000, qps=[qp("h2", 1e6)])
    console = Console(width=200, record=True, file=open("/dev/null", "w"))
    console.print(render(prev, cur))
    text = console.export_text()
    assert "PAUSED" in text and "100.0" in text and "ecmp" in text and "dcqcn" in text
    view = json_view(prev, cur)
    assert view["rates"]["leaf1-eth3"]["tx_gbps"] == pytest.approx(100.0)
    assert view["busiest_qps"][0]["gbps"] == pytest.approx(2.0)


def test_final_row_adds_ecn_total():
    row = {"switch": "leaf1", "port": 1, "intf": "leaf1-eth1", "peer": "h1", "kind": "host", "tx_bytes": 5,
           "ecn_marked_p0": 1, "ecn_marked_p3": 2, "ecn_marked_p6": 0}
    assert final_row(row) == {"tx_bytes": 5, "ecn_marked_p0": 1, "ecn_marked_p3": 2, "ecn_marked_p6": 0,
                              "ecn_marked": 3}


def test_manifest_round_trip_and_phase(tmp_path):
    m = LiveManifest("r1", "q", 2000.0, "ecmp", "dcqcn", str(tmp_path), "/sys/fs/bpf/x", "",
                     [LivePort(0, "leaf1", 1, "leaf1-eth1", "h1", "host", 100.0)], path=str(tmp_path / "live.json"))
    m.save()
    assert LiveManifest.load(m.path).phase == "setup"
    m.baseline = []
    m.save()
    assert LiveManifest.load(m.path) == m and m.phase == "traffic"


def test_agent_publisher_writes_rates_once_per_call(tmp_path):
    req = SimpleNamespace(bytes_sent=1000, bytes_acked=900, packets_sent=3, retransmitted=0)
    sq = SimpleNamespace(qp=SimpleNamespace(src_qpn=5, dst_qpn=6, dst="h1", udp_sport=49200), req=req,
                         frame_bytes=0, cnp_received=1, rate_bps=None)
    rq = SimpleNamespace(qp=SimpleNamespace(dst_qpn=7, src="h3"), resp=SimpleNamespace(bytes=10, packets=1),
                         ecn_ce=2, cnp_sent=2)
    host = SimpleNamespace(name="h2", done=False, nic=SimpleNamespace(send_qps=[sq], recv_qps=[rq]))
    clock = iter([10.0, 12.0])
    pub = LivePublisher(0, [host], tmp_path / "engine0.live.json", lambda: next(clock))
    pub.publish()
    sq.frame_bytes = 2_000_000
    pub.publish()
    d = json.loads((tmp_path / "engine0.live.json").read_text())
    s = d["hosts"]["h2"]["send"][0]
    assert s["tx_bps"] == pytest.approx(8e6) and s["remote_qpn"] == 6 and s["cnp_received"] == 1
    assert d["hosts"]["h2"]["recv"][0]["ecn_ce"] == 2


def test_the_dashboard_asks_only_for_metrics_the_exporter_serves():
    import re
    from pathlib import Path

    served = {n for n, _ in _samples(snap(101.0, 5, qps=[qp("h2", 1e6)]))}
    dash = (Path(__file__).resolve().parents[2] / "docs" / "grafana" / "fabric-emu.json").read_text()
    asked = set(re.findall(r"fabric_emu_[a-z_]+", dash)) - {"fabric_emu"}
    assert asked and asked <= served, asked - served


def test_top_says_how_many_of_the_pauses_went_to_nics():
    cur = snap(101.0, 0)
    cur.ports.append(PortSample("leaf1", 1, "leaf1-eth1", "h1", "host", 100.0,
                                {**cur.ports[0].counters, "pause_tx_p3": 7}, {3: 0}, {3: False}))
    console = Console(width=300, record=True, file=open("/dev/null", "w"))
    console.print(render(None, cur))
    assert "11 PFC pauses sent by switch ports (7 of them to NICs)" in console.export_text()
