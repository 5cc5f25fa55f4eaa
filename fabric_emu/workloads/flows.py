"""Flows and incast, pure: their flows, the hosts that run an agent, their line-rate time.

Incast and flows workloads both come down to a list of Flow: `size` bytes per iteration from src
to dst, split evenly over `qps` queue pairs (one RDMA WRITE message per queue pair per
iteration), starting `start_s` of modelled time after the common start. An incast is one flow
per sender to the receiver, all starting at 0:

    h2 ---.
    h3 ---+--> h1      incast {receiver: h1, senders: [h2, h3, h4]}: Flow(h2, h1, size), ...
    h4 ---'

Both run on the flows driver (fabric_emu.nic.drivers.flows). The yardsticks of a run without a
Program (workload_line_rate_s, planned_bytes) also cover the single ring all-reduce, the other
workload with a driver of its own (fabric_emu.workloads.collectives.RingAllReduce).
"""

from __future__ import annotations

from dataclasses import dataclass

from fabric_emu.workloads.collectives import ring_allreduce_line_rate_s, split_even
from fabric_emu.spec.workloads import AllReduceWorkload, FlowsWorkload, IncastWorkload


@dataclass(frozen=True)
class Flow:
    src: str
    dst: str
    size: int  # bytes per iteration
    qps: int = 1
    start_s: float = 0.0  # modelled seconds after the common start
    iterations: int = 1
    gap_s: float = 0.0  # modelled idle time after each acknowledged iteration

    @property
    def total_bytes(self) -> int:
        return self.size * self.iterations

    @property
    def parts(self) -> list[int]:
        """Bytes per queue pair of one iteration's message."""
        return split_even(self.size, self.qps)


def incast_senders(w: IncastWorkload, hosts: list[str]) -> list[str]:
    """The senders in the order the spec gives them; 'all' is every host but the receiver."""
    return [h for h in hosts if h != w.receiver] if w.senders == "all" else list(w.senders)


def workload_flows(w: IncastWorkload | FlowsWorkload, hosts: list[str]) -> list[Flow]:
    """The flows of an incast or flows workload, in spec order; hosts: the fabric's, in order."""
    if isinstance(w, IncastWorkload):
        return [Flow(s, w.receiver, w.size, w.qps_per_sender, 0.0, w.iterations)
                for s in incast_senders(w, hosts)]
    if isinstance(w, FlowsWorkload):
        return [Flow(f.src, f.dst, f.size if f.size is not None else w.size, f.qps, f.start, f.iterations, f.gap)
                for f in w.flows]
    raise TypeError(f"{w.type} is not made of flows")


def named_hosts(w: IncastWorkload | FlowsWorkload) -> list[tuple[str, str]]:
    """(dotted field under workload, host name) for every host the spec names."""
    if isinstance(w, IncastWorkload):
        senders = [] if w.senders == "all" else [(f"senders.{i}", h) for i, h in enumerate(w.senders)]
        return [("receiver", w.receiver), *senders]
    return [(f"flows.{i}.{end}", getattr(f, end)) for i, f in enumerate(w.flows) for end in ("src", "dst")]


def unknown_hosts(w: IncastWorkload | FlowsWorkload, hosts: list[str]) -> list[tuple[str, str]]:
    """(field, message) for each host name that is not in the fabric."""
    known = set(hosts)
    return [(f"workload.{field}", f"unknown host {name!r} (hosts are {hosts[0]}..{hosts[-1]})")
            for field, name in named_hosts(w) if name not in known]


def agent_hosts(flows: list[Flow], hosts: list[str]) -> list[str]:
    """The hosts that send or receive, in the fabric's host order: they, and only they, run an agent."""
    involved = {f.src for f in flows} | {f.dst for f in flows}
    return [h for h in hosts if h in involved]


def flows_line_rate_s(flows: list[Flow], rate_bps: float, dilation: float) -> float:
    """Emulated time at line rate: the busiest host link (bytes sent or received, payload only)
    plus the latest start (and a flow's gaps). For an incast that is all the bytes over the receiver's link."""
    sent: dict[str, int] = {}
    received: dict[str, int] = {}
    for f in flows:  # links are full duplex: each direction is its own bottleneck
        sent[f.src] = sent.get(f.src, 0) + f.total_bytes
        received[f.dst] = received.get(f.dst, 0) + f.total_bytes
    busiest = max([*sent.values(), *received.values()], default=0)
    # the latest start, with the idle gaps between a flow's iterations
    latest = max((f.start_s + f.gap_s * (f.iterations - 1) for f in flows), default=0.0)
    return busiest * 8 / rate_bps + latest * dilation


def workload_line_rate_s(w: AllReduceWorkload | IncastWorkload | FlowsWorkload, ranks: list[str],
                         hosts: list[str], rate_bps: float, dilation: float) -> float:
    """The emulated time at the host line rate (payload only) of a workload with a driver of its
    own: the timeout's yardstick (a Program's: fabric_emu.workloads.jobs.line_rate_s)."""
    if isinstance(w, AllReduceWorkload):
        return ring_allreduce_line_rate_s(w.size, len(ranks), w.iterations, rate_bps)
    return flows_line_rate_s(workload_flows(w, hosts), rate_bps, dilation)


def planned_bytes(w: AllReduceWorkload | IncastWorkload | FlowsWorkload, ranks: list[str],
                  hosts: list[str]) -> int:
    """Payload bytes all receivers get when the workload completes (a ring all-reduce: each of
    n ranks receives 2(n-1)/n x size per iteration)."""
    if isinstance(w, AllReduceWorkload):
        return 2 * (len(ranks) - 1) * w.size * w.iterations
    return sum(f.total_bytes for f in workload_flows(w, hosts))
