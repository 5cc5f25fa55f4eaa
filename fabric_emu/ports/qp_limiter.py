"""Per-queue-pair rate limiters of a host NIC, enforced by the kernel.

The NIC model (fabric_emu.nic) decides each send queue pair's DCQCN rate; the kernel paces the
packets. On a host NIC the RoCE class's PFC gate (TBF 13:, see fabric_emu.ports.queues) holds an
HTB 30: instead of a FIFO: queue pair k's socket carries SO_MARK qp_mark(k), the port's
qp_classify program (bpf/port.c) puts its packets in class 30:<mark>, whose rate = ceil = the
pair's current rate. Packets without a QP mark (ACKs, NAKs, anything else of the RoCE class) go
to HTB's direct queue: unshaped here, still held by the gate and paced by the port's classes.

Rates change many times a second per pair, so they are changed by raw rtnetlink messages
(fabric_emu.kernel.rtnl: ~10 us a change, measured) rather than pyroute2's tc() (~1.7 ms), on a
socket of the host's namespace, as queues.Gate does.

Classification (net/sched/cls_bpf.c, direct-action mode, and net/core/filter.c): cls_bpf
presets skb->tc_classid to the filter's classid, runs the program, and hands HTB
TC_H_MAJ(filter classid) | tc_classid. tc_classid is a 16-bit field (qdisc_skb_cb; a program's
store to it is rewritten as a 16-bit store), so the program picks only the minor and the major
must come from the filter: datapath attaches it with classid 30:0. An unmarked packet then
reaches HTB as 30:0, which htb_classify takes as "direct queue"; a marked one as 30:<mark>.
Attached with classid 0, every packet would come out as 0:<mark>, no class of HTB 30:, and go
to the direct queue: QPs unshaped, silently (measured). skb->priority (1:13, set by host_egress
for the outer tree) names no class of HTB 30:, so the filter runs. The mark does not leave the
host: veth scrubs it on the way to the switch's namespace.

How HTB applies a rate change (net/sched/sch_htb.c; measured in
tests/integration/test_qp_limiter.py): htb_change_class recomputes rate, ceil and bucket sizes
but keeps the class's tokens, which are time (ns), not bytes, its checkpoint and its place in the
event queue; only creating a class (or a parent turning back into a leaf) resets them. A packet
is charged when it leaves, at the rate then in force, and the class may send again once its
tokens are back to zero. So a new rate takes effect from the next departure: a cut at most one
packet time at the old, higher rate later (prompt); a raise only once the gap charged at the OLD
rate has passed. After a deep cut that gap is long (a 1514-byte frame at 100 kbit/s: 121 ms;
measured with 1442-byte frames: a raise to 24 Mbit/s 10.7 ms after a departure charged at
100 kbit/s left the next departure where it was, 115.3 ms after it), and no netlink operation
shortens it short of deleting the class with its queue. HTB caps a
debt at 60 s (mbuffer). raise_lag_s() gives the bound. Simulators reschedule instead (HPCC's
ns-3 DCQCN, RdmaHw::ChangeRate: next departure += S/R_new - S/R_old); a NIC model that needs
that at low rates has to hold the packets of queue pairs below some floor rate itself.
"""

from __future__ import annotations

import socket

from fabric_emu.kernel import rtnl, shaping
from fabric_emu.kernel.rtnl import RTM_NEWQDISC, RTM_NEWTCLASS, check_ack

QP_MAJOR = 0x300000  # the HTB 30: inside the RoCE class's gate
QP_MINOR_BASE = 0x100  # queue pair k: class 30:(0x100 + k), SO_MARK 0x100 + k
QP_MAX = 0xFFFF - QP_MINOR_BASE  # the largest k whose mark still fits a class minor
BURST_FRAMES = 2  # bucket of each QP class: two frames, so the rate is enforced tightly
MAX_BURST_TIME_S = shaping.MAX_BURST_TIME_S  # the bucket in psched ticks must fit a u32
MIN_RATE_BYTES_PER_S = shaping.MIN_RATE_BYTES_PER_S
HTB_MAX_DEBT_S = 60.0  # sch_htb's mbuffer: no class owes more time than this
DIRECT_QLEN = 1000  # packets HTB's direct queue holds (unmarked RoCE-class packets: ACKs)


def qp_mark(k: int) -> int:
    """The SO_MARK of the host's k-th queue pair, also the minor of its class 30:<mark>."""
    if not 0 <= k <= QP_MAX:
        raise ValueError(f"queue pair index {k} outside 0..{QP_MAX}")
    return QP_MINOR_BASE + k


def qp_class(k: int) -> int:
    """The HTB class id of the host's k-th queue pair."""
    return QP_MAJOR | qp_mark(k)


def qp_qdisc(ifindex: int, parent: int, direct_qlen: int = DIRECT_QLEN) -> bytes:
    """RTM_NEWQDISC body of the empty QP HTB 30: (default class 0: the direct queue) under `parent`."""
    return rtnl.htb_qdisc(ifindex, QP_MAJOR, parent, 0, direct_qlen)


def install(sock: socket.socket, ifindex: int, parent: int, direct_qlen: int = DIRECT_QLEN) -> None:
    """Create the empty QP HTB 30: under class `parent`."""
    rtnl.ask_for_details(sock)
    sock.send(rtnl.message(RTM_NEWQDISC, rtnl.CREATE, qp_qdisc(ifindex, parent, direct_qlen), seq=1))
    check_ack(sock, 1, f"ifindex {ifindex}: QP qdisc {QP_MAJOR >> 16:x}: not created")


class QpLimiter:
    """The per-QP rate classes of one host NIC, over one raw rtnetlink socket of the host's
    namespace (rtnl.netlink_socket). Not thread-safe: one caller per socket."""

    def __init__(self, sock: socket.socket, ifindex: int, mtu: int, *, ifname: str | None = None):
        self.sock = sock
        self.ifindex = ifindex
        self.frame = mtu + shaping.ETH_HEADER  # mtu: the link's IP MTU
        self.name = ifname or f"ifindex {ifindex}"
        self._seq = 1
        rtnl.ask_for_details(sock)

    def add(self, k: int, rate_bps: float) -> None:
        """Create queue pair k's class at rate_bps (emulated bit/s), or take over the one an
        earlier traffic phase on this host left (a job run alone before the jobs together)."""
        self._send(k, rate_bps, rtnl.NLM_F_CREATE, "not created")

    def set_rate(self, k: int, rate_bps: float) -> None:
        """Change queue pair k's rate in place (its queued packets stay). HTB applies the new
        rate from the class's next departure, so a raise first waits out the current gap, at
        most raise_lag_s(old rate) (module docstring)."""
        self._send(k, rate_bps, 0, "rate not changed")

    def raise_lag_s(self, rate_bps: float) -> float:
        """The longest a raise from rate_bps may wait before it takes effect: one full frame at
        that rate (the debt HTB charged when the class's last packet left)."""
        return min(self.frame * 8 / max(8 * MIN_RATE_BYTES_PER_S, rate_bps), HTB_MAX_DEBT_S)

    def _send(self, k: int, rate_bps: float, flags: int, failure: str) -> None:
        classid = qp_class(k)
        rate = max(MIN_RATE_BYTES_PER_S, round(rate_bps / 8))
        burst = min(BURST_FRAMES * self.frame, int(rate * MAX_BURST_TIME_S))
        self._seq = seq = self._seq % 0xFFFFFFFF + 1
        body = rtnl.htb_class(self.ifindex, classid, QP_MAJOR, rate, rate, burst, burst, self.frame)
        self.sock.send(rtnl.message(RTM_NEWTCLASS, rtnl.CHANGE | flags, body, seq))
        check_ack(self.sock, seq, f"{self.name}: class {classid >> 16:x}:{classid & 0xFFFF:x} {failure}")
