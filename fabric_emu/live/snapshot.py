"""A live snapshot of a running fabric, and what is derived from two of them. Pure: the reader
(fabric_emu.live.reader) fills it from counters; top, the exporter and tests consume it.

Port counters mean what ports.csv's columns mean (fabric_emu.measure.counters.PortCounters.row): once
the run has a baseline (the counters when traffic started) they count from it, so the last
snapshot of a run equals its ports.csv; before that they count from the ports' creation.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field

from fabric_emu.cc.deadlock import Buffer, cycle_bytes, cycles, egresses, wait_for_graph

PRIORITIES = (0, 3, 6)
LOSSLESS = 3


@dataclass
class PortSample:
    """One switch port now: its ports.csv counters, and the state counters do not show."""

    switch: str
    port: int
    intf: str
    peer: str
    kind: str  # "host" | "fabric"
    gbps: float  # modelled link rate
    counters: dict[str, int]  # ports.csv columns: tx_bytes, drops, ecn_marked_p3, pause_tx_p3, ...
    queue_bytes: dict[int, int] = field(default_factory=dict)  # priority -> tc backlog now
    paused: dict[int, bool] = field(default_factory=dict)  # priority -> its gate closed by PFC now
    # PFC watchdog on the port's lossless queue and storms (docs/pfc-watchdog.md)
    stormed: bool = False  # the watchdog holds the queue stormed now
    storms_detected: int = 0  # storms the watchdog declared on the queue, this run
    storms_restored: int = 0  # and restored
    peer_storming: bool = False  # the NIC beyond the port is in a PFC storm now

    def get(self, key: str) -> int:
        return int(self.counters.get(key, 0))


@dataclass
class QpSample:
    """One sending queue pair: its counters and its rate over the engine's last second."""

    host: str
    qpn: int
    dst: str
    udp_src: int
    frame_bytes: int
    bytes_sent: int
    packets: int
    retransmitted: int
    cnp_received: int
    tx_bps: float  # emulated, Ethernet frame bits, over the NIC engine's last interval
    dcqcn_rate_bps: float | None  # modelled; None: DCQCN is not limiting it
    ecn_ce: int = 0  # at the receiver: CE-marked packets of this QP
    cnp_sent: int = 0  # at the receiver: CNPs sent for this QP


@dataclass
class DeadlockCycle:
    """A PFC deadlock seen now (fabric_emu.cc.deadlock): lossless buffers X.in(Y), each waiting
    on the next, the last on the first, through egresses their next pauses."""

    members: list[str]  # "r1.in(r4)", in the cycle's order, starting at its smallest
    edge_bytes: list[int]  # bytes members[i] holds for (and waits on) members[i+1], the last for the first

    @property
    def held_bytes(self) -> int:
        return sum(self.edge_bytes)

    @property
    def text(self) -> str:
        return " -> ".join(self.members)

    def egresses(self) -> list[tuple[str, str]]:
        """The paused egresses (switch, peer) the cycle runs through, one per member."""
        return egresses([Buffer.parse(m) for m in self.members])


def deadlock_cycles(held: Mapping[tuple[str, str, str], int], paused: Collection[tuple[str, str]],
                    switches: Collection[str]) -> list[DeadlockCycle]:
    """The cycles of the wait-for graph now (held and paused as fabric_emu.cc.deadlock has them)."""
    if not paused:
        return []
    g = wait_for_graph(held, paused, switches)
    return [DeadlockCycle([str(b) for b in c], list(cycle_bytes(g, c))) for c in cycles(g)]


@dataclass
class Snapshot:
    run_id: str
    experiment: str
    taken: float  # wall clock (epoch seconds) when read; emulated time runs at wall speed
    phase: str  # "setup" (fabric up, no traffic yet) | "traffic" | "done" (final counters)
    dilation: float
    go: float | None  # when traffic started (epoch), if it did
    load_balancing: str
    congestion_control: str
    ports: list[PortSample]
    qps: list[QpSample] = field(default_factory=list)
    fidelity: dict = field(default_factory=dict)  # cpu_busy, cpu_saturated, ovs_thread_busy, ...
    baseline: bool = False  # counters count from traffic start (True) or from port creation
    notes: list[str] = field(default_factory=list)  # what could not be read this time
    deadlocks: list[DeadlockCycle] = field(default_factory=list)  # PFC deadlock cycles now

    @property
    def emulated_s(self) -> float:
        """Seconds since traffic started (0 before), emulated (wall clock)."""
        if self.go is None:
            return 0.0
        return max(0.0, self.taken - self.go)

    @property
    def modelled_s(self) -> float:
        return self.emulated_s / self.dilation

    def to_dict(self) -> dict:
        d = asdict(self)
        d["emulated_s"], d["modelled_s"] = self.emulated_s, self.modelled_s
        for p in d["ports"]:  # JSON keys are strings
            p["queue_bytes"] = {str(k): v for k, v in p["queue_bytes"].items()}
            p["paused"] = {str(k): v for k, v in p["paused"].items()}
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Snapshot":
        d = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        ports = [PortSample(**{**p, "queue_bytes": {int(k): v for k, v in p["queue_bytes"].items()},
                                "paused": {int(k): v for k, v in p["paused"].items()}})
                 for p in d.pop("ports")]
        qps = [QpSample(**q) for q in d.pop("qps", [])]
        deadlocks = [DeadlockCycle(**c) for c in d.pop("deadlocks", [])]
        return cls(ports=ports, qps=qps, deadlocks=deadlocks, **d)


@dataclass(frozen=True)
class PortRate:
    """A port's rates between two snapshots, in modelled Gb/s (emulated bits/s x dilation)."""

    tx_gbps: float
    rx_gbps: float
    tx_util: float  # fraction of the link's modelled rate
    ecn_per_s: float  # ECN marks per emulated second, all classes


def port_rates(prev: Snapshot, cur: Snapshot) -> dict[str, PortRate]:
    """Rates from counter deltas, by interface. A counter that went down (the baseline was set
    in between) or an interval of zero gives no rate for that port."""
    dt = cur.taken - prev.taken
    if dt <= 0 or prev.baseline != cur.baseline:
        return {}
    before = {p.intf: p for p in prev.ports}
    out = {}
    for p in cur.ports:
        b = before.get(p.intf)
        if b is None:
            continue
        dtx, drx = p.get("tx_bytes") - b.get("tx_bytes"), p.get("rx_bytes") - b.get("rx_bytes")
        dmark = p.get("ecn_marked") - b.get("ecn_marked")
        if dtx < 0 or drx < 0:
            continue
        tx = dtx * 8 / dt * cur.dilation / 1e9
        rx = drx * 8 / dt * cur.dilation / 1e9
        out[p.intf] = PortRate(tx, rx, tx / p.gbps if p.gbps else 0.0, max(0, dmark) / dt)
    return out


def qp_gbps(q: QpSample, dilation: float) -> float:
    """A QP's send rate in modelled Gb/s."""
    return q.tx_bps * dilation / 1e9


def busiest_qps(snap: Snapshot, n: int) -> list[QpSample]:
    return sorted(snap.qps, key=lambda q: (-q.tx_bps, q.host, q.qpn))[:n]


@dataclass(frozen=True)
class StormSummary:
    """The fabric's PFC watchdog and NIC storms now (empty when neither has happened)."""

    stormed: list[str]  # interfaces whose lossless queue the watchdog holds stormed now
    detected: int  # storms detected, all queues, this run
    restored: int
    nics_storming: list[str]  # hosts whose NIC storms now (the peers of their switch ports)

    def __bool__(self) -> bool:  # worth a line: the watchdog acted, or a NIC storms
        return bool(self.stormed or self.detected or self.nics_storming)


def storm_summary(snap: Snapshot) -> StormSummary:
    ports = snap.ports
    return StormSummary([p.intf for p in ports if p.stormed], sum(p.storms_detected for p in ports),
                        sum(p.storms_restored for p in ports),
                        sorted({p.peer for p in ports if p.peer_storming}))


def deadlocked_ports(snap: Snapshot) -> set[str]:
    """Interfaces whose paused egress is on a deadlock cycle now: the port of switch X toward Z
    for every member Z.in(X)."""
    on = {e for c in snap.deadlocks for e in c.egresses()}
    return {p.intf for p in snap.ports if (p.switch, p.peer) in on}


def totals(snap: Snapshot) -> dict[str, int]:
    """Fabric-wide sums of a snapshot's port counters (as summary.json's `switch` block)."""
    keys = ("tx_bytes", "tx_packets", "drops", "ecn_marked", "pause_tx_p3", "pause_rx_p3")
    return {k: sum(p.get(k) for p in snap.ports) for k in keys}
