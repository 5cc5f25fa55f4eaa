"""Drives independent flows (and so an incast) on the NIC: posts each flow's WRITEs at its start.

Every agent gets the same flow list; a host sends the flows whose src it is and receives those
whose dst it is. Each iteration of a flow is one RDMA WRITE message per queue pair (the flow's
size split evenly over them). Iterations run back to back without a barrier: iteration i+1 is
posted as soon as every message of iteration i has left this NIC. The host has finished when
everything it sends is acknowledged and every receive QP has completed the messages it expects.
Progress is read off the NIC's per-QP message counters, as for the ring.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fabric_emu.nic.config import FlowConfig
from fabric_emu.nic.host_nic import HostNic
from fabric_emu.workloads.collectives import split_even


def own_qps(flows: Sequence[FlowConfig], host: str) -> tuple[list[int], list[int]]:
    """The flow index of each of this host's send QPs and receive QPs, in the NIC's order.

    The QP table lists every flow's queue pairs in flow order (build_qp_table with one edge per
    flow), and the NIC keeps this host's in table order.
    """
    send = [k for k, f in enumerate(flows) if f.src == host for _ in range(f.qps)]
    recv = [k for k, f in enumerate(flows) if f.dst == host for _ in range(f.qps)]
    return send, recv


@dataclass
class _Sending:
    flow: int
    cfg: FlowConfig
    qps: list[int]  # indices into nic.send_qps
    start: float  # epoch seconds
    log: dict
    posted: int = 0  # iterations handed to the NIC
    sent: int = 0  # iterations whose every message has left
    done: bool = False  # every message of every iteration acknowledged
    next_at: float | None = None  # with a gap: when the next iteration may be posted


@dataclass
class _Receiving:
    flow: int
    cfg: FlowConfig
    qps: list[int]  # indices into nic.recv_qps
    log: dict
    done: bool = False


class FlowRunner:
    def __init__(self, flows: Sequence[FlowConfig], host: str, nic: HostNic, go: float):
        """go: the common start (epoch seconds) that every flow's start_s counts from."""
        send, recv = own_qps(flows, host)
        if len(send) != len(nic.send_qps) or len(recv) != len(nic.recv_qps):
            raise ValueError("the NIC's queue pairs do not match this host's flows")
        self.nic = nic
        self._sending: list[_Sending] = []
        self._receiving: list[_Receiving] = []
        self.flow_log: list[dict] = []  # one entry per flow this host sends or receives
        for k, f in enumerate(flows):
            if f.src == host:
                log = {"flow": k, "role": "send", "dst": f.dst, "start": go + f.start_s,
                       "iterations": [], "sent": None}
                self._sending.append(_Sending(k, f, [i for i, j in enumerate(send) if j == k],
                                              go + f.start_s, log))
                self.flow_log.append(log)
            if f.dst == host:
                parts = split_even(f.size, f.qps)
                log = {"flow": k, "role": "receive", "src": f.src,
                       "expected_bytes": [p * f.iterations for p in parts],
                       "expected_messages": f.iterations, "received": None}
                self._receiving.append(_Receiving(k, f, [i for i, j in enumerate(recv) if j == k], log))
                self.flow_log.append(log)
        self._parts = {k: split_even(f.size, f.qps) for k, f in enumerate(flows)}
        self._unfinished = len(self._sending) + len(self._receiving)

    @property
    def finished(self) -> bool:
        return self._unfinished == 0

    @property
    def wake_at(self) -> float | None:
        """The earliest start of a flow not posted yet, or end of a gap."""
        starts = [s.start for s in self._sending if not s.posted]
        starts += [s.next_at for s in self._sending if s.next_at is not None and not s.done]
        return min(starts, default=None)

    def advance(self, now: float) -> None:
        """Record what completed and post every iteration that may start now (called every loop)."""
        send_qps, recv_qps = self.nic.send_qps, self.nic.recv_qps
        for s in self._sending:
            if s.done:
                continue
            left = min(send_qps[i].messages_sent for i in s.qps)
            if left > s.sent:
                for it in s.log["iterations"][s.sent:left]:
                    it["sent"] = now
                s.sent = left
                if s.sent == s.cfg.iterations:
                    s.log["sent"] = now
            if s.sent == s.cfg.iterations:
                if min(send_qps[i].messages_done for i in s.qps) >= s.cfg.iterations:
                    s.done = True  # a flow ends when its last WRITE is acknowledged
                    s.log["acked"] = now
                    self._unfinished -= 1
                continue
            if s.posted == s.sent and now >= s.start:
                if s.posted and s.cfg.gap_s > 0 and not self._gap_over(s, now):
                    continue
                for i, nbytes in zip(s.qps, self._parts[s.flow]):
                    self.nic.post_write(i, nbytes, now)
                s.log["iterations"].append({"iteration": s.posted, "posted": now, "sent": None})
                s.posted += 1
        for r in self._receiving:
            if not r.done and all(recv_qps[i].messages >= r.cfg.iterations for i in r.qps):
                r.done = True
                r.log["received"] = now
                self._unfinished -= 1

    def _gap_over(self, s: _Sending, now: float) -> bool:
        """With a gap: the flow stays idle for gap_s after its last iteration is acknowledged
        (so the wire really is idle that long: a flowlet boundary for DLB)."""
        if s.next_at is None:
            if min(self.nic.send_qps[i].messages_done for i in s.qps) < s.posted:
                return False  # not acknowledged yet
            s.next_at = now + s.cfg.gap_s
        if now < s.next_at:
            return False
        s.next_at = None
        return True
