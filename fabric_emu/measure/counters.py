"""Switch port counters: OpenFlow port statistics, the kernel class queues, the port programs'
and PFC daemon's counters (BPF map), and the drops of the sockets through which OVS's userspace
datapath receives from each port.

Snapshots are taken before and after the traffic phase; results use the difference, so ARP,
controller chatter and set-up traffic do not count. Port statistics are read live over
OpenFlow: the OVSDB statistics column is refreshed only every 5 s.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from fabric_emu.topo.plan import FabricPlan
from fabric_emu.ports import queues
from fabric_emu.kernel.shaping import IPRoutePool
from fabric_emu.measure.sampling import Sampler

OVS_KEYS = ("rx_bytes", "rx_packets", "tx_bytes", "tx_packets", "rx_dropped", "tx_dropped")
CLASSES = (0, 3, 6)  # priorities with their own queue: default, RoCE (lossless), CNP
# Counted by the kernel qdiscs (per class) and the port programs and PFC daemon (BPF map).
CLASS_KEYS = tuple(f"{k}_p{p}" for k in ("queue_drops", "bpf_drops", "ecn_marked", "pause_tx", "pause_rx",
                                         "paused_ns") for p in CLASSES)
COUNTERS = (*OVS_KEYS, "rx_socket_drops", *CLASS_KEYS, "lossless_drops", "headroom_overruns", "cut_drops")
# High-water marks (not differenced): deepest egress queue per class; most lossless bytes held
# in the switch that came in through this port (what PFC's xoff is compared with).
MAX_KEYS = (*(f"max_backlog_p{p}" for p in CLASSES), "max_held_p3")


@dataclass
class PortCounters:
    """One switch port. Per class (_p0, _p3, _p6): queue_drops (kernel FIFO, should stay 0),
    bpf_drops (tail drops of the port program's admission), ecn_marked, pause frames sent and
    received, time paused (ns, emulated), deepest backlog."""

    switch: str
    port: int
    intf: str
    peer: str
    kind: str
    rx_bytes: int = 0
    rx_packets: int = 0
    tx_bytes: int = 0
    tx_packets: int = 0
    rx_dropped: int = 0  # OVS could not take the packet in
    tx_dropped: int = 0  # OVS could not hand the packet to the device
    rx_socket_drops: int = 0  # the port's receive socket in ovs-vswitchd overflowed
    queue_drops_p0: int = 0
    queue_drops_p3: int = 0
    queue_drops_p6: int = 0
    bpf_drops_p0: int = 0
    bpf_drops_p3: int = 0
    bpf_drops_p6: int = 0
    ecn_marked_p0: int = 0
    ecn_marked_p3: int = 0
    ecn_marked_p6: int = 0
    pause_tx_p0: int = 0
    pause_tx_p3: int = 0
    pause_tx_p6: int = 0
    pause_rx_p0: int = 0
    pause_rx_p3: int = 0
    pause_rx_p6: int = 0
    paused_ns_p0: int = 0
    paused_ns_p3: int = 0
    paused_ns_p6: int = 0
    lossless_drops: int = 0  # priority-3 drops while PFC was on: an ingress port's buffer overflowed
    headroom_overruns: int = 0  # lossless frames that came in beyond xoff + headroom: a late pause
    max_backlog_p0: int = 0
    max_backlog_p3: int = 0
    max_backlog_p6: int = 0
    max_held_p3: int = 0
    max_backlog_bytes: int = 0  # deepest the whole egress buffer was in the samples
    ttl_expired: int = 0  # IPv4 packets that came in here with no TTL left to forward (a routing loop's end)
    cut_drops: int = 0  # frames Open vSwitch sent out of here while the link was cut (bpf/port.c link_cut)

    def class_drops(self, prio: int) -> int:
        return getattr(self, f"queue_drops_p{prio}") + getattr(self, f"bpf_drops_p{prio}")

    @property
    def drops(self) -> int:
        return (self.rx_dropped + self.tx_dropped + self.rx_socket_drops + self.ttl_expired + self.cut_drops
                + sum(self.class_drops(p) for p in CLASSES))

    @property
    def ecn_marked(self) -> int:
        return sum(getattr(self, f"ecn_marked_p{p}") for p in CLASSES)

    def row(self, dilation: float = 1.0) -> dict:
        d = asdict(self)
        d["drops"] = self.drops
        for p in CLASSES:
            d[f"drops_p{p}"] = self.class_drops(p)
            d[f"paused_fabric_us_p{p}"] = round(d.pop(f"paused_ns_p{p}") / 1e3 / dilation, 3)
        return d

    def minus(self, before: "PortCounters") -> "PortCounters":
        diff = {k: getattr(self, k) - getattr(before, k) for k in COUNTERS}
        highs = {k: getattr(self, k) for k in MAX_KEYS}
        return PortCounters(self.switch, self.port, self.intf, self.peer, self.kind, **diff, **highs)


_PORT_STATS = re.compile(
    r"port\s+(\d+): rx pkts=(\d+), bytes=(\d+), drop=(\d+).*?\n\s+tx pkts=(\d+), bytes=(\d+), drop=(\d+)")
_SOCKET_DROPS = re.compile(r"\*:(\S+)\s.*\"ovs-vswitchd\".*skmem:\(.*\bd(\d+)\)")


def parse_dump_ports(text: str) -> dict[int, dict[str, int]]:
    """`ovs-ofctl dump-ports` output -> {port number: counters}."""
    out = {}
    for m in _PORT_STATS.finditer(text):
        rxp, rxb, rxd, txp, txb, txd = map(int, m.groups()[1:])
        out[int(m.group(1))] = {"rx_packets": rxp, "rx_bytes": rxb, "rx_dropped": rxd,
                                "tx_packets": txp, "tx_bytes": txb, "tx_dropped": txd}
    return out


def port_stats(switch: str) -> dict[int, dict[str, int]]:
    out = subprocess.run(["ovs-ofctl", "-O", "OpenFlow15", "--no-names", "dump-ports", switch],
                         check=True, capture_output=True, text=True, timeout=10).stdout
    return parse_dump_ports(out)


def parse_socket_drops(text: str) -> dict[str, int]:
    """`ss -0 -a -m -n -p` output -> {interface: drops of ovs-vswitchd's packet socket on it}."""
    return {m.group(1): int(m.group(2)) for m in map(_SOCKET_DROPS.search, text.splitlines()) if m}


def ovs_socket_drops() -> dict[str, int]:
    out = subprocess.run(["ss", "-0", "-a", "-m", "-n", "-p"], check=True, capture_output=True,
                         text=True, timeout=10).stdout
    return parse_socket_drops(out)


def snapshot(plan: FabricPlan, ports: dict[str, dict[str, int]] | None = None,
             switches: set[str] | None = None) -> list[PortCounters]:
    """Counters of every switch port (of `switches` only, when given: one machine's share of a
    fabric over several), in plan order; `ports` are the port programs' counters
    (LosslessPorts.counters()), by interface."""
    socket_drops = ovs_socket_drops()
    rows = []
    mine = [sw for sw in plan.switches if switches is None or sw.name in switches]
    ends = [(sw.name, p) for sw in mine for p in plan.ports(sw.name)]
    stats = {sw.name: port_stats(sw.name) for sw in mine}
    with IPRoutePool() as pool:
        kernel = {p.intf: queues.class_stats(p.intf, pool=pool) for _, p in ends}
    for sw, p in ends:
        rows.append(port_counters(sw, p.port, p.intf, p.peer, p.kind, stats[sw].get(p.port, {}),
                                  socket_drops.get(p.intf, 0),
                                  {prio: kernel[p.intf][prio].drops for prio in CLASSES},
                                  (ports or {}).get(p.intf, {})))
    return rows


def port_counters(switch: str, port: int, intf: str, peer: str, kind: str, ovs: dict[str, int],
                  socket_drops: int, queue_drops: dict[int, int], bpf: dict[str, int]) -> PortCounters:
    """One port's counters from their sources: OpenFlow port stats, ovs-vswitchd's receive
    socket drops, the kernel class FIFOs' drops (by priority), the BPF map (PortMaps.counters).
    The run's snapshots and the live reader (fabric_emu.live.reader) both build rows here."""
    per_class = {}
    for prio in CLASSES:
        per_class.update({
            f"queue_drops_p{prio}": queue_drops.get(prio, 0),
            f"bpf_drops_p{prio}": bpf.get(f"drops_p{prio}", 0),
            f"ecn_marked_p{prio}": bpf.get(f"marked_p{prio}", 0),
            f"pause_tx_p{prio}": bpf.get(f"pause_tx_p{prio}", 0),
            f"pause_rx_p{prio}": bpf.get(f"pause_rx_p{prio}", 0),
            f"paused_ns_p{prio}": bpf.get(f"paused_ns_p{prio}", 0),
            f"max_backlog_p{prio}": bpf.get(f"max_queue_p{prio}", 0),
        })
    return PortCounters(
        switch=switch, port=port, intf=intf, peer=peer, kind=kind,
        **{k: ovs.get(k, 0) for k in OVS_KEYS}, rx_socket_drops=socket_drops,
        lossless_drops=bpf.get("lossless_drops", 0), headroom_overruns=bpf.get("headroom_overruns", 0),
        cut_drops=bpf.get("cut_drops", 0),
        max_held_p3=bpf.get("max_held_p3", 0),
        **per_class,
    )


def delta(after: list[PortCounters], before: list[PortCounters]) -> list[PortCounters]:
    """Counters during the phase, after - before, port by port.

    A port absent from `before` has no baseline: its counters would be totals since the port
    was created, so this raises ValueError rather than report them as the phase's."""
    prev = {(c.switch, c.port): c for c in before}
    unknown = [c.intf for c in after if (c.switch, c.port) not in prev]
    if unknown:
        raise ValueError(f"port counters: {', '.join(unknown)} missing from the snapshot before "
                         "traffic, so their counts during it are unknown")
    return [c.minus(prev[(c.switch, c.port)]) for c in after]


def totals(rows: list[PortCounters], dilation: float = 1.0) -> dict:
    """summary.json's `switch` block."""
    return {
        "tx_packets": sum(r.tx_packets for r in rows),
        "tx_bytes": sum(r.tx_bytes for r in rows),
        "drops": sum(r.drops for r in rows),
        "drops_by_class": {f"p{p}": sum(r.class_drops(p) for r in rows) for p in CLASSES},
        "lossless_drops": sum(r.lossless_drops for r in rows),
        "headroom_overruns": sum(r.headroom_overruns for r in rows),
        "cut_link_drops": sum(r.cut_drops for r in rows),
        "ecn_marked": sum(r.ecn_marked for r in rows),
        "pause_tx": sum(r.pause_tx_p3 for r in rows),
        "pause_rx": sum(r.pause_rx_p3 for r in rows),
        "paused_fabric_us": round(sum(r.paused_ns_p3 for r in rows) / 1e3 / dilation, 3),
        "ports_paused": sum(1 for r in rows if r.paused_ns_p3),
        "max_backlog_bytes_p3": max((r.max_backlog_p3 for r in rows), default=0),
    }


def nic_totals(plan: FabricPlan, before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict:
    """summary.json's `nic` block: how often and how long PFC paused the hosts' NICs."""
    hosts = [h.intf for h in plan.hosts]
    paused_ns = sum(after[i]["paused_ns_p3"] - before[i]["paused_ns_p3"] for i in hosts)
    return {"pause_rx": sum(after[i]["pause_rx_p3"] - before[i]["pause_rx_p3"] for i in hosts),
            "pause_tx": sum(after[i]["pause_tx_p3"] - before[i]["pause_tx_p3"] for i in hosts),
            "paused_fabric_us": round(paused_ns / 1e3 / plan.dilation, 3),
            "nics_paused": sum(1 for i in hosts if after[i]["paused_ns_p3"] > before[i]["paused_ns_p3"]),
            "paused_s_by_host": {h.name: (after[h.intf]["paused_ns_p3"] - before[h.intf]["paused_ns_p3"]) / 1e9
                                 for h in plan.hosts}}


class QueueSampler(Sampler):
    """Samples the egress backlog of every switch port, per class, while traffic runs.

    `backlogs` gives {interface: {priority: bytes}} and `paused` {interface: bool}; the run takes
    both from the port programs' map through mmap (LosslessPorts), which costs microseconds for a
    whole fabric where a netlink dump of every qdisc cost ~20 ms of Python per sample. `rows` is
    the time series (seconds since the start, emulated), `max_backlog` the deepest each port got.
    """

    def __init__(self, plan: FabricPlan, backlogs, paused, interval_s: float = 0.1) -> None:
        self.plan = plan
        self.interval_s = interval_s
        self.backlogs = backlogs
        self.paused = paused
        self.rows: list[dict] = []
        self.max_backlog: dict[str, int] = {}
        self.start = time.monotonic()

    def shift(self, origin: float) -> None:
        """Re-express the time series from `origin` (monotonic seconds), e.g. the agents' GO."""
        dt = origin - self.start
        for row in self.rows:
            row["t_s"] = round(row["t_s"] - dt, 4)
            row["t_fabric_us"] = round(row["t_s"] / self.plan.dilation * 1e6, 3)

    def ticks(self) -> Iterator[None]:
        ports = [(sw.name, p) for sw in self.plan.switches for p in self.plan.ports(sw.name)]
        start = self.start = time.monotonic()
        while True:
            yield
            t = time.monotonic() - start
            backlogs, paused = self.backlogs(), self.paused()
            for sw, p in ports:
                per_class = backlogs.get(p.intf, {})
                nbytes = sum(per_class.values())
                self.max_backlog[p.intf] = max(self.max_backlog.get(p.intf, 0), nbytes)
                self.rows.append({
                    "t_s": round(t, 4), "t_fabric_us": round(t / self.plan.dilation * 1e6, 3),
                    "switch": sw, "port": p.port, "peer": p.peer, "backlog_bytes": nbytes,
                    **{f"p{c}_bytes": per_class.get(c, 0) for c in CLASSES},
                    "paused": int(paused.get(p.intf, False))})
