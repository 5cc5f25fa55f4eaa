"""`dilation: auto`, pure: the packet rates a run asks of this machine, and the lowest dilation
that keeps them well inside what the machine was measured to do (fabric_emu.measure.capacity).

Every emulated rate is the modelled rate / D, so the load at dilation D is the load at D = 1
(the modelled fabric's own packet rates) divided by D. What a run asks for:
- switching: every flow at its fair share of the host links, in full frames, times the switch
  hops of its path (the plan's equal-cost paths all have the same length), plus one ACK per
  `ack_every` data packets back along the same hops. A ring all-reduce keeps every rank
  sending at line rate; incast senders share the receiver's link; a flows workload is taken
  as if every flow ran at once (max-min fair over the host links): a bound, not a schedule.
  Fabric links are not a limit here (an oversubscribed fabric carries less, so this is safe).
- NICs: packets the engines send and receive, data and ACKs, spread over the engine
  processes as the workload deals them (hosts round-robin over min(hosts, cores) engines).

MARGIN = 0.5: the chosen dilation keeps each figure at most half of what was measured, because
the measurements are best cases: OVS's figure is one flow through one bridge with full batches,
while a fabric spreads paced packets over dozens of ports, each hop also paying its classifier
lookup and egress qdisc, and sparse arrivals cost OVS a main-loop wakeup each (~100 us measured,
against ~10 us per frame when it is flooded); the NIC figure is the floor of Python's send path
(fabric_emu.measure.nic_capacity), which an engine does not reach; collectives are bursty (ring steps,
incast); and the controller, the PFC daemon and the samplers share the cores. The run's
fidelity check (per-thread CPU, achieved rates, loss) still judges the result.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from fabric_emu.spec.experiment import ExperimentSpec
from fabric_emu.spec.workloads import AllReduceWorkload
from fabric_emu.topo.plan import ETH_HEADER, ROCE_IP_OVERHEAD, FabricPlan

MARGIN = 0.5
MAX_DILATION = 1_000_000  # TopologySpec's upper bound
DEFAULT_ACK_EVERY = 16


@dataclass(frozen=True)
class Capacity:
    """What this machine was measured to do, per core (fabric_emu.measure.capacity measures it)."""

    ovs_pps: float  # frame-hops/s OVS's one forwarding thread does with a whole core
    nic_pps: float  # packets/s one core of a NIC engine handles
    cores: int
    mtu: int
    ovs_wakeup_s: float = 0.0  # OVS CPU per frame when frames arrive one by one (0: unknown)
    details: dict = field(default_factory=dict, compare=False)
    # Which OVS datapath ovs_pps is of: the userspace one's thread, or the kernel's softirq
    # time per core (fabric_emu.measure.capacity). Either is taken as one core's worth.
    datapath: str = "userspace"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Capacity":
        return cls(float(d["ovs_pps"]), float(d["nic_pps"]), int(d["cores"]), int(d["mtu"]),
                   float(d.get("ovs_wakeup_s", 0.0)), d.get("details", {}), d.get("datapath", "userspace"))


@dataclass(frozen=True)
class PlannedLoad:
    """Packets/s a run asks for at dilation 1; at dilation D divide by D."""

    switch_pps: float  # frame-hops/s over all switches (data and ACKs)
    nic_pps: float  # packets/s all NICs send and receive (data and ACKs)
    host_pps: dict[str, float]  # per host, in the order the engines are dealt their hosts
    flows: int
    frame_bytes: int

    def to_dict(self) -> dict:
        return {"switch_pps": round(self.switch_pps), "nic_pps": round(self.nic_pps),
                "busiest_host_pps": round(max(self.host_pps.values(), default=0)),
                "hosts": len(self.host_pps), "flows": self.flows, "frame_bytes": self.frame_bytes}


def fair_rates(pairs: list[tuple[str, str]], link_bps: dict[str, float]) -> list[float]:
    """Max-min fair rate of each (src, dst) flow, limited only by the host links: each host's
    sending side and its receiving side (full duplex) is one bottleneck of link_bps[host]."""
    rates = [0.0] * len(pairs)
    left = {("tx", h): bps for h, bps in link_bps.items()} | {("rx", h): bps for h, bps in link_bps.items()}
    ends = [(("tx", src), ("rx", dst)) for src, dst in pairs]
    active = set(range(len(pairs)))
    while active:  # progressive filling: raise every active flow alike until a link is full
        users: dict[tuple[str, str], int] = {}
        for i in active:
            for ln in ends[i]:
                users[ln] = users.get(ln, 0) + 1
        step = min(left[ln] / n for ln, n in users.items())
        for i in active:
            rates[i] += step
            for ln in ends[i]:
                left[ln] -= step
        full = {ln for ln in users if left[ln] <= 1e-9 * link_bps[ln[1]]}
        active = {i for i in active if not full & set(ends[i])}
    return rates


def _pairs(spec: ExperimentSpec, plan: FabricPlan, ranks: list[str]) -> list[tuple[str, str]]:
    from fabric_emu.workloads.flows import workload_flows

    from fabric_emu.workloads import jobs

    if jobs.uses_program(spec):  # every channel of every job, as if all were busy at once
        return jobs.pairs(jobs.build_program(jobs.resolve_jobs(spec, plan)))
    w = spec.workload
    if isinstance(w, AllReduceWorkload):  # a ring: each rank sends to the next
        return [(r, ranks[(i + 1) % len(ranks)]) for i, r in enumerate(ranks)]
    return [(f.src, f.dst) for f in workload_flows(w, [h.name for h in plan.hosts])]


def planned_load(spec: ExperimentSpec, plan: FabricPlan, ranks: list[str]) -> PlannedLoad:
    """The packet rates of this workload on this fabric, at dilation 1."""
    transport = getattr(spec, "transport", None)
    ack_every = getattr(transport, "ack_every", DEFAULT_ACK_EVERY)
    pairs = _pairs(spec, plan, ranks)
    link_bps = {h: plan.host_rate_bps(h) * plan.dilation for h in ranks}
    frame = plan.roce_mtu + ROCE_IP_OVERHEAD + ETH_HEADER
    acks = 1 / ack_every
    switch = nic = 0.0
    host = {h: 0.0 for h in ranks}
    for (src, dst), bps in zip(pairs, fair_rates(pairs, link_bps)):
        data = bps / (frame * 8)
        hops = len(plan.paths(src, dst)[0]) - 2
        switch += data * (1 + acks) * hops
        nic += 2 * data * (1 + acks)  # sent and received, each way
        host[src] += data * (1 + acks)  # data out, ACKs in
        host[dst] += data * (1 + acks)  # data in, ACKs out
    return PlannedLoad(switch, nic, host, len(pairs), frame)


def engine_count(hosts: int, cores: int) -> int:
    """NIC engine processes: one per core, at most one per host (as fabric_emu.nic.launch deals them)."""
    return max(1, min(hosts, cores))


def ovs_cores(load: PlannedLoad, cap: Capacity, dilation: float) -> float:
    """Cores OVS's forwarding thread takes at this dilation: its frames at the flooded cost, or
    at the one-by-one wakeup cost if that was measured (at most one core; on a one-core machine
    it shares it with the engines, taken as half each)."""
    per_frame = max(1 / cap.ovs_pps, cap.ovs_wakeup_s)
    return min(1.0, cap.cores / 2, load.switch_pps / dilation * per_frame)


def utilisation(load: PlannedLoad, cap: Capacity, dilation: float) -> dict[str, float]:
    """Each part of the machine's load at this dilation, as a fraction of what it can do:
    ovs (its one thread), nic (all engines, on the cores OVS leaves them) and the busiest
    engine (one process, one core)."""
    engines = engine_count(len(load.host_pps), cap.cores)
    hosts = list(load.host_pps.values())
    busiest = max((sum(hosts[e::engines]) for e in range(engines)), default=0.0)
    engine_cores = max(cap.cores - ovs_cores(load, cap, dilation), 0.5)
    return {
        "ovs": load.switch_pps / dilation / cap.ovs_pps,
        "nic": load.nic_pps / dilation / (cap.nic_pps * min(engine_cores, engines)),
        "busiest_engine": busiest / dilation / cap.nic_pps,
    }


def nice_numbers(start: float = 1, stop: float = MAX_DILATION):
    """1, 2, 5, 10, 20, 50, ... from the first >= start up to stop."""
    k = 1
    while k <= stop:
        for m in (1, 2, 5):
            if start <= m * k <= stop:
                yield m * k
        k *= 10


def choose_dilation(planned: PlannedLoad, capacity: Capacity, margin: float = MARGIN) -> int:
    """The lowest 'nice' dilation (1, 2, 5 x 10^k) at which every part of the machine stays at
    most `margin` busy; MAX_DILATION if even that is not enough."""
    for d in nice_numbers():
        if max(utilisation(planned, capacity, d).values()) <= margin:
            return int(d)
    return MAX_DILATION


def explain(planned: PlannedLoad, capacity: Capacity, dilation: int, margin: float = MARGIN) -> dict:
    """The figures behind a choice, for show, summary.json and the terminal."""
    use = utilisation(planned, capacity, dilation)
    limit = max(use, key=use.get)
    return {
        "dilation": dilation, "margin": margin,
        "planned_at_dilation_1": planned.to_dict(),
        "planned_at_dilation": {"switch_pps": round(planned.switch_pps / dilation),
                                "nic_pps": round(planned.nic_pps / dilation)},
        "capacity": {"ovs_pps_per_core": round(capacity.ovs_pps), "nic_pps_per_core": round(capacity.nic_pps),
                     "cores": capacity.cores, "mtu": capacity.mtu,
                     "ovs_wakeup_us": round(capacity.ovs_wakeup_s * 1e6, 1), "datapath": capacity.datapath},
        "utilisation": {k: round(v, 4) for k, v in use.items()},
        "engines": engine_count(len(planned.host_pps), capacity.cores),
        "ovs_cores": round(ovs_cores(planned, capacity, dilation), 2),
        "reason": (f"the lowest of 1, 2, 5 x 10^k keeping OVS, the NIC engines and the busiest engine at "
                   f"most {margin:.0%} busy (now {use['ovs']:.0%}, {use['nic']:.0%}, "
                   f"{use['busiest_engine']:.0%}; {limit} limits)"),
    }
