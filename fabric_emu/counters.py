"""Switch port counters: Open vSwitch interface statistics plus the kernel egress queues.

Snapshots are taken before and after the traffic phase; results use the difference, so ARP,
controller chatter and set-up traffic do not count.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict, dataclass

from fabric_emu import shaping
from fabric_emu.plan import FabricPlan

OVS_KEYS = ("rx_bytes", "rx_packets", "tx_bytes", "tx_packets", "rx_dropped", "tx_dropped")
COUNTERS = (*OVS_KEYS, "queue_drops", "queue_overlimits")


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
    queue_drops: int = 0  # tail drops of the egress buffer (kernel bfifo)
    queue_overlimits: int = 0

    @property
    def drops(self) -> int:
        return self.rx_dropped + self.tx_dropped + self.queue_drops

    def row(self) -> dict:
        d = asdict(self)
        d["drops"] = self.drops
        return d

    def minus(self, before: "PortCounters") -> "PortCounters":
        diff = {k: getattr(self, k) - getattr(before, k) for k in COUNTERS}
        return PortCounters(self.switch, self.port, self.intf, self.peer, self.kind, **diff)


def ovs_interface_stats() -> dict[str, dict[str, int]]:
    """Statistics of every OVS interface, by name, from one ovs-vsctl call."""
    out = subprocess.run(
        ["ovs-vsctl", "--timeout=10", "--format=json", "--columns=name,statistics",
         "list", "interface"], check=True, capture_output=True, text=True).stdout
    stats = {}
    for name, (_, pairs) in json.loads(out)["data"]:
        stats[name] = {k: int(v) for k, v in pairs}
    return stats


def snapshot(plan: FabricPlan) -> list[PortCounters]:
    """Counters of every switch port, in plan order."""
    ovs = ovs_interface_stats()
    rows = []
    ends = [(sw.name, p) for sw in plan.switches for p in plan.ports(sw.name)]
    with shaping.IPRoutePool() as pool:
        queues = {p.intf: shaping.egress_stats(p.intf, pool=pool) for _, p in ends}
    for sw, p in ends:
        s = ovs.get(p.intf, {})
        q = queues[p.intf]
        rows.append(PortCounters(
            switch=sw, port=p.port, intf=p.intf, peer=p.peer, kind=p.kind,
            **{k: s.get(k, 0) for k in OVS_KEYS},
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
