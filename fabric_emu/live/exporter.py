"""Prometheus exporter of a running fabric: a custom collector that turns a live snapshot into
metric families on each scrape (nothing is counted per packet; an idle exporter costs nothing).

Counters count from the start of the traffic phase, as ports.csv does; before it, only gauges
and info are served (no counter ever goes back). Rates are Prometheus's job: modelled Gb/s of a
port is `rate(fabric_emu_port_transmit_bytes_total[5s]) * 8 * scalar(fabric_emu_dilation) / 1e9`.
Bound to 127.0.0.1 (DESIGN.md: listeners bind to loopback).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from http.server import ThreadingHTTPServer

from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.exposition import start_http_server

from fabric_emu.live.snapshot import PRIORITIES, Snapshot, deadlocked_ports

LISTEN_HOST = "127.0.0.1"
PORT_LABELS = ["switch", "port", "peer"]
PHASES = ("setup", "traffic", "done")

# (metric name without _total, ports.csv column, help); per port, as counters
PORT_COUNTERS = (
    ("fabric_emu_port_transmit_bytes", "tx_bytes", "Bytes the switch port sent (OpenFlow port stats)"),
    ("fabric_emu_port_receive_bytes", "rx_bytes", "Bytes the switch port received (OpenFlow port stats)"),
    ("fabric_emu_port_transmit_packets", "tx_packets", "Packets the switch port sent"),
    ("fabric_emu_port_receive_packets", "rx_packets", "Packets the switch port received"),
    ("fabric_emu_port_dropped_packets", "drops",
     "Packets dropped at the port, every cause (ports.csv drops: OVS, socket, FIFO and admission)"),
    ("fabric_emu_port_lossless_dropped_packets", "lossless_drops",
     "Priority-3 packets dropped while PFC was on (an ingress port's buffer overflowed)"),
    ("fabric_emu_port_headroom_overruns", "headroom_overruns",
     "Priority-3 frames that entered by this port beyond xoff + headroom: a pause fabric-emu put into effect late"),
)
# (name, ports.csv column prefix before _p<k>, help); per port and priority
CLASS_COUNTERS = (
    ("fabric_emu_ecn_marked_packets", "ecn_marked", "Packets the port's program marked CE"),
    ("fabric_emu_class_dropped_packets", "drops", "Packets of the class dropped at the port"),
)


def _port_labels(p) -> list[str]:
    return [p.switch, str(p.port), p.peer]


def metric_families(snap: Snapshot | None) -> list[Metric]:
    """Every metric of a snapshot (pure: the unit tests feed it fake snapshots)."""
    if snap is None:
        return []
    out: list[Metric] = []
    info = InfoMetricFamily("fabric_emu_run", "The run being exported",
                            labels=["run_id", "experiment", "load_balancing", "congestion_control", "phase"])
    info.add_metric([snap.run_id, snap.experiment, snap.load_balancing, snap.congestion_control, snap.phase], {})
    out.append(info)
    out.append(GaugeMetricFamily("fabric_emu_dilation", "Emulated time per modelled time (time dilation)",
                                 value=snap.dilation))
    out.append(GaugeMetricFamily("fabric_emu_modelled_seconds",
                                 "Modelled (real-fabric) seconds since traffic started", value=snap.modelled_s))
    out.append(GaugeMetricFamily("fabric_emu_emulated_seconds",
                                 "Emulated (wall-clock) seconds since traffic started", value=snap.emulated_s))
    phase = GaugeMetricFamily("fabric_emu_phase", "1 for the phase the run is in", labels=["phase"])
    for ph in PHASES:
        phase.add_metric([ph], float(ph == snap.phase))
    out.append(phase)
    out += _fidelity(snap)

    link = GaugeMetricFamily("fabric_emu_port_link_gbps", "The port's modelled link rate, Gb/s", labels=PORT_LABELS)
    depth = GaugeMetricFamily("fabric_emu_queue_depth_bytes", "Bytes waiting in the port's egress class now (tc backlog)",
                              labels=[*PORT_LABELS, "priority"])
    paused = GaugeMetricFamily("fabric_emu_pfc_paused", "1 while PFC holds the port's class", labels=[*PORT_LABELS, "priority"])
    for p in snap.ports:
        link.add_metric(_port_labels(p), p.gbps)
        for prio in PRIORITIES:
            if prio in p.queue_bytes:
                depth.add_metric([*_port_labels(p), str(prio)], p.queue_bytes[prio])
            if prio in p.paused:
                paused.add_metric([*_port_labels(p), str(prio)], float(p.paused[prio]))
    out += [link, depth, paused, *_storm_gauges(snap), *_deadlock_gauges(snap)]
    if snap.baseline:  # counters only once they count from traffic start (never go back)
        out += _port_counters(snap) + _storm_counters(snap)
    out += _qps(snap)
    return out


def _fidelity(snap: Snapshot) -> list[Metric]:
    f = snap.fidelity
    out = []
    if "cpu_busy" in f:
        out.append(GaugeMetricFamily("fabric_emu_cpu_busy_ratio", "Busy fraction of all cores since the last read",
                                     value=f["cpu_busy"]))
    if "ovs_thread_busy" in f:
        out.append(GaugeMetricFamily("fabric_emu_ovs_thread_busy_ratio",
                                     "Busy fraction of one core of ovs-vswitchd's busiest thread", value=f["ovs_thread_busy"]))
    out.append(GaugeMetricFamily("fabric_emu_fidelity_saturated",
                                 "1 when every core is busy (the CPU is saturated): results are not to be trusted",
                                 value=float(bool(f.get("saturated")))))
    return out


def _port_counters(snap: Snapshot) -> list[Metric]:
    out: list[Metric] = []
    for name, key, doc in PORT_COUNTERS:
        c = CounterMetricFamily(name, doc, labels=PORT_LABELS)
        for p in snap.ports:
            c.add_metric(_port_labels(p), p.get(key))
        out.append(c)
    for name, key, doc in CLASS_COUNTERS:
        c = CounterMetricFamily(name, doc, labels=[*PORT_LABELS, "priority"])
        for p in snap.ports:
            for prio in PRIORITIES:
                c.add_metric([*_port_labels(p), str(prio)], p.get(f"{key}_p{prio}"))
        out.append(c)
    pause = CounterMetricFamily("fabric_emu_pfc_pause_frames", "PFC pause frames the port sent (tx) or received (rx)",
                                labels=[*PORT_LABELS, "priority", "direction"])
    held = CounterMetricFamily("fabric_emu_pfc_paused_modelled_seconds",
                               "Modelled seconds the port's class was held by PFC", labels=[*PORT_LABELS, "priority"])
    for p in snap.ports:
        for prio in PRIORITIES:
            for direction in ("tx", "rx"):
                pause.add_metric([*_port_labels(p), str(prio), direction], p.get(f"pause_{direction}_p{prio}"))
            held.add_metric([*_port_labels(p), str(prio)], p.counters.get(f"paused_fabric_us_p{prio}", 0) / 1e6)
    return [*out, pause, held]


def _storm_gauges(snap: Snapshot) -> list[Metric]:
    """The PFC watchdog's status of each port's lossless queue, and NIC storms beyond ports."""
    stormed = GaugeMetricFamily("fabric_emu_pfcwd_stormed",
                                "1 while the PFC watchdog holds the port's lossless queue stormed", labels=PORT_LABELS)
    peer = GaugeMetricFamily("fabric_emu_pfc_storm_peer",
                             "1 while the NIC beyond the port is in a PFC storm (stalled, pausing its leaf)",
                             labels=PORT_LABELS)
    for p in snap.ports:
        stormed.add_metric(_port_labels(p), float(p.stormed))
        peer.add_metric(_port_labels(p), float(p.peer_storming))
    return [stormed, peer]


def _deadlock_gauges(snap: Snapshot) -> list[Metric]:
    """PFC deadlocks now: how many cycles, and which ports' paused egresses they run through."""
    n = GaugeMetricFamily("fabric_emu_deadlock_cycles",
                          "PFC deadlock cycles in the lossless buffers' wait-for graph now", value=len(snap.deadlocks))
    member = GaugeMetricFamily("fabric_emu_deadlock_port",
                               "1 while the port's paused egress is on a PFC deadlock cycle (its peer's buffer for "
                               "this switch's bytes is a member)", labels=PORT_LABELS)
    locked = deadlocked_ports(snap)
    for p in snap.ports:
        member.add_metric(_port_labels(p), float(p.intf in locked))
    return [n, member]


def _storm_counters(snap: Snapshot) -> list[Metric]:
    detected = CounterMetricFamily("fabric_emu_pfcwd_storms_detected",
                                   "Storms the PFC watchdog detected on the port's lossless queue "
                                   "(SONiC's PFC_WD_QUEUE_STATS_DEADLOCK_DETECTED)", labels=PORT_LABELS)
    restored = CounterMetricFamily("fabric_emu_pfcwd_storms_restored",
                                   "Storms the PFC watchdog restored on the port's lossless queue "
                                   "(PFC_WD_QUEUE_STATS_DEADLOCK_RESTORED)", labels=PORT_LABELS)
    for p in snap.ports:
        detected.add_metric(_port_labels(p), p.storms_detected)
        restored.add_metric(_port_labels(p), p.storms_restored)
    return [detected, restored]


def _qps(snap: Snapshot) -> list[Metric]:
    labels = ["host", "qpn", "dst", "udp_src"]
    rate = GaugeMetricFamily("fabric_emu_qp_transmit_rate_modelled_bits_per_second",
                             "The QP's send rate over the NIC's last second, modelled bit/s (frames)", labels=labels)
    limit = GaugeMetricFamily("fabric_emu_qp_dcqcn_rate_modelled_bits_per_second",
                              "The rate DCQCN holds the QP to now, modelled bit/s (absent: not limited)", labels=labels)
    sent = CounterMetricFamily("fabric_emu_qp_transmit_bytes", "Ethernet frame bytes the QP sent", labels=labels)
    retx = CounterMetricFamily("fabric_emu_qp_retransmitted_packets", "Packets the QP sent again", labels=labels)
    cnp_rx = CounterMetricFamily("fabric_emu_qp_cnp_received", "CNPs the QP's sender received", labels=labels)
    cnp_tx = CounterMetricFamily("fabric_emu_qp_cnp_sent", "CNPs the QP's receiver sent", labels=labels)
    ce = CounterMetricFamily("fabric_emu_qp_ecn_ce_received_packets", "CE-marked packets of the QP at its receiver",
                             labels=labels)
    for q in snap.qps:
        lab = [q.host, str(q.qpn), q.dst, str(q.udp_src)]
        rate.add_metric(lab, q.tx_bps * snap.dilation)
        if q.dcqcn_rate_bps is not None:
            limit.add_metric(lab, q.dcqcn_rate_bps)
        sent.add_metric(lab, q.frame_bytes)
        retx.add_metric(lab, q.retransmitted)
        cnp_rx.add_metric(lab, q.cnp_received)
        cnp_tx.add_metric(lab, q.cnp_sent)
        ce.add_metric(lab, q.ecn_ce)
    return [rate, limit, sent, retx, cnp_rx, cnp_tx, ce]


class SnapshotCollector:
    """Reads a snapshot on each scrape; after freeze(), serves that one snapshot."""

    def __init__(self, source: Callable[[], Snapshot]) -> None:
        self.source = source
        self.frozen: Snapshot | None = None
        self._lock = threading.Lock()  # one read at a time: the reader keeps handles and deltas

    def freeze(self, snap: Snapshot | None) -> None:
        self.frozen = snap  # None: live again (a lab's next run)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            snap = self.frozen if self.frozen is not None else self.source()
        yield from metric_families(snap)


class MetricsServer:
    """The exporter's HTTP server on LISTEN_HOST (port 0: a free one), in a daemon thread."""

    def __init__(self, source: Callable[[], Snapshot], port: int = 0) -> None:
        self.collector = SnapshotCollector(source)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self._server: ThreadingHTTPServer
        self._server, self._thread = start_http_server(port, addr=LISTEN_HOST, registry=self.registry)
        self.port = self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://{LISTEN_HOST}:{self.port}/metrics"

    def freeze(self, snap: Snapshot | None) -> None:
        self.collector.freeze(snap)

    def serving(self) -> bool:
        """Its thread still serves (the run's supervisor asks)."""
        return self._thread.is_alive()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
