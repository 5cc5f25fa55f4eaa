"""Runs every host's ProgramRunner against a fake NIC and a fake wire (pure, no sockets): a
message takes bytes / rate plus a latency, channels share nothing. For schedule tests."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from fabric_emu.nic.drivers.program import ProgramRunner
from fabric_emu.nic.scale_up import ScaleUpChannels
from fabric_emu.workloads.program import Program
from fabric_emu.nic.launch import host_programs


@dataclass
class FakeSendQp:
    messages_sent: int = 0
    messages_done: int = 0


@dataclass
class FakeRecvQp:
    messages: int = 0


@dataclass
class FakeNic:
    send_qps: list[FakeSendQp]
    recv_qps: list[FakeRecvQp]
    wire: "Wire"
    host: str
    posted: list[tuple[int, int]] = field(default_factory=list)

    def post_write(self, q: int, nbytes: int, now: float) -> None:
        self.posted.append((q, nbytes))
        self.wire.carry(self.host, q, nbytes, now)


class Wire:
    def __init__(self, rate_Bps: float, latency_s: float):
        self.rate, self.latency = rate_Bps, latency_s
        self.events: list[tuple[float, int, str, int]] = []  # (time, seq, dst host, recv qp)
        self.route: dict[tuple[str, int], tuple[str, int]] = {}
        self.free_at: dict[tuple[str, int], float] = {}
        self.nics: dict[str, FakeNic] = {}
        self._n = 0

    def carry(self, host: str, q: int, nbytes: int, now: float) -> None:
        nic = self.nics[host]
        nic.send_qps[q].messages_sent += 1
        nic.send_qps[q].messages_done += 1
        start = max(now, self.free_at.get((host, q), 0.0))  # a QP sends its messages in order
        end = start + nbytes / self.rate
        self.free_at[(host, q)] = end
        self._n += 1
        heapq.heappush(self.events, (end + self.latency, self._n, *self.route[(host, q)]))


def run(p: Program, rate_Bps: float = 1e9, latency_s: float = 0.0, limit_s: float = 1e6,
        servers: list[ScaleUpChannels] = ()):
    """Run to completion; returns (runners by host, nics by host, end time). Raises on deadlock.
    servers: the scale-up domains of the program's scale-up channels."""
    wire = Wire(rate_Bps, latency_s)
    cfgs = host_programs(p, 1.0)
    runners: dict[str, ProgramRunner] = {}
    # The QP table in channel order: QP k of channel c is send QP i of src and recv QP j of dst.
    nsend: dict[str, int] = {}
    nrecv: dict[str, int] = {}
    for c in p.channels:
        if c.via != "fabric":
            continue
        for _ in range(c.qps):
            i, j = nsend.get(c.src, 0), nrecv.get(c.dst, 0)
            wire.route[(c.src, i)] = (c.dst, j)
            nsend[c.src], nrecv[c.dst] = i + 1, j + 1
    for h in set(nsend) | set(nrecv) | set(cfgs):
        wire.nics[h] = FakeNic([FakeSendQp() for _ in range(nsend.get(h, 0))],
                               [FakeRecvQp() for _ in range(nrecv.get(h, 0))], wire, h)
    for h, cfg in cfgs.items():
        domain = next((d for d in servers if h in d.hosts), None)
        runners[h] = ProgramRunner(cfg, h, wire.nics[h], domain)
    now = 0.0
    while True:
        for d in servers:
            d.advance(now)
        for r in runners.values():
            r.advance(now)
        if all(r.finished for r in runners.values()):
            return runners, wire.nics, now
        wakes = [r.wake_at for r in runners.values() if r.wake_at is not None]
        wakes += [t for t in (d.next_event() for d in servers) if t is not None]
        nxt = min([*wakes, *(e[0] for e in wire.events[:1])], default=None)
        if nxt is None or nxt > limit_s:
            stuck = {h: r._left for h, r in runners.items() if not r.finished}
            raise RuntimeError(f"deadlock at t={now}: ops left {stuck}")
        now = max(now, nxt)
        while wire.events and wire.events[0][0] <= now:
            _, _, dst, j = heapq.heappop(wire.events)
            wire.nics[dst].recv_qps[j].messages += 1


def times(p: Program, runners) -> list:
    from fabric_emu.workloads.jobs import op_times
    return op_times(p, {h: r.op_log() for h, r in runners.items()})
