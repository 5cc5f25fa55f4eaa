"""Switch port counters: OpenFlow port statistics, the kernel egress queues, and the drops of
the sockets through which OVS's userspace datapath receives from each port.

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

from fabric_emu import shaping
from fabric_emu.plan import FabricPlan
from fabric_emu.sampling import Sampler

OVS_KEYS = ("rx_bytes", "rx_packets", "tx_bytes", "tx_packets", "rx_dropped", "tx_dropped")
COUNTERS = (*OVS_KEYS, "rx_socket_drops", "queue_drops", "queue_overlimits")


@dataclass
class PortCounters:
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
    queue_drops: int = 0  # tail drops of the egress buffer (kernel bfifo)
    queue_overlimits: int = 0
    max_backlog_bytes: int = 0  # deepest the egress buffer was in the samples (not a delta)

    @property
    def drops(self) -> int:
        return self.rx_dropped + self.tx_dropped + self.rx_socket_drops + self.queue_drops

    def row(self) -> dict:
        d = asdict(self)
        d["drops"] = self.drops
        return d

    def minus(self, before: "PortCounters") -> "PortCounters":
        diff = {k: getattr(self, k) - getattr(before, k) for k in COUNTERS}
        return PortCounters(self.switch, self.port, self.intf, self.peer, self.kind, **diff)


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


def snapshot(plan: FabricPlan) -> list[PortCounters]:
    """Counters of every switch port, in plan order."""
    socket_drops = ovs_socket_drops()
    rows = []
    ends = [(sw.name, p) for sw in plan.switches for p in plan.ports(sw.name)]
    stats = {sw.name: port_stats(sw.name) for sw in plan.switches}
    with shaping.IPRoutePool() as pool:
        queues = {p.intf: shaping.egress_stats(p.intf, pool=pool) for _, p in ends}
    for sw, p in ends:
        s = stats[sw].get(p.port, {})
        q = queues[p.intf]
        rows.append(PortCounters(
            switch=sw, port=p.port, intf=p.intf, peer=p.peer, kind=p.kind,
            **{k: s.get(k, 0) for k in OVS_KEYS}, rx_socket_drops=socket_drops.get(p.intf, 0),
            queue_drops=q.drops, queue_overlimits=q.overlimits,
        ))
    return rows


def delta(after: list[PortCounters], before: list[PortCounters]) -> list[PortCounters]:
    prev = {(c.switch, c.port): c for c in before}
    return [c.minus(prev[(c.switch, c.port)]) if (c.switch, c.port) in prev else c for c in after]


def totals(rows: list[PortCounters]) -> dict[str, int]:
    return {
        "tx_packets": sum(r.tx_packets for r in rows),
        "tx_bytes": sum(r.tx_bytes for r in rows),
        "drops": sum(r.drops for r in rows),
    }


class QueueSampler(Sampler):
    """Samples the egress backlog of every switch port while traffic runs.

    One netlink dump per sample; `rows` is the time series (seconds since the start, emulated),
    `max_backlog` the deepest each port got.
    """

    def __init__(self, plan: FabricPlan, interval_s: float = 0.1) -> None:
        self.plan = plan
        self.interval_s = interval_s
        self.rows: list[dict] = []
        self.max_backlog: dict[str, int] = {}

    def ticks(self) -> Iterator[None]:
        ports = [(sw.name, p) for sw in self.plan.switches for p in self.plan.ports(sw.name)]
        with shaping.IPRoutePool() as pool:
            ipr = pool.get(None)
            index_of = {p.intf: ipr.link_lookup(ifname=p.intf)[0] for _, p in ports}
            start = time.monotonic()
            while True:
                yield
                t = time.monotonic() - start
                backlogs = shaping.egress_backlogs(pool=pool)
                for sw, p in ports:
                    nbytes, npackets = backlogs.get(index_of[p.intf], (0, 0))
                    self.max_backlog[p.intf] = max(self.max_backlog.get(p.intf, 0), nbytes)
                    self.rows.append({
                        "t_s": round(t, 4), "t_fabric_us": round(t / self.plan.dilation * 1e6, 3),
                        "switch": sw, "port": p.port, "peer": p.peer,
                        "backlog_bytes": nbytes, "backlog_packets": npackets})
