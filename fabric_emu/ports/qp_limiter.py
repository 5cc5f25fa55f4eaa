"""Per-queue-pair rate limiters of a host NIC, enforced by the kernel.

The NIC model (fabric_emu.nic) decides each send queue pair's DCQCN rate; the kernel paces the
packets. On a host NIC the RoCE class's PFC gate (TBF 13:, see fabric_emu.ports.queues) holds an
HTB 30: instead of a FIFO: queue pair k's socket carries SO_MARK qp_mark(k), the port's
qp_classify program (bpf/port.c) puts its packets in class 30:<mark>, whose rate = ceil = the
pair's current rate. Packets without a QP mark (ACKs, NAKs, anything else of the RoCE class) go
to HTB's direct queue: unshaped here, still held by the gate and paced by the port's classes.

Rates change many times a second per pair, so they are changed by raw rtnetlink messages built
with struct (~10 us a change, measured) rather than pyroute2's tc() (~1.7 ms), on a socket of the
host's namespace, as queues.Gate does. The rate spec says "Ethernet link layer", so the kernel
needs no rate table (htb_change_class reads one only for TC_LINKLAYER_UNAWARE).

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

import errno
import os
import socket
import struct

from pyroute2.netlink.rtnl.tcmsg.common import tick_in_usec

from fabric_emu.kernel import shaping

QP_MAJOR = 0x300000  # the HTB 30: inside the RoCE class's gate
QP_MINOR_BASE = 0x100  # queue pair k: class 30:(0x100 + k), SO_MARK 0x100 + k
QP_MAX = 0xFFFF - QP_MINOR_BASE  # the largest k whose mark still fits a class minor
BURST_FRAMES = 2  # bucket of each QP class: two frames, so the rate is enforced tightly
MAX_BURST_TIME_S = shaping.MAX_BURST_TIME_S  # the bucket in psched ticks must fit a u32
MIN_RATE_BYTES_PER_S = shaping.MIN_RATE_BYTES_PER_S
HTB_MAX_DEBT_S = 60.0  # sch_htb's mbuffer: no class owes more time than this
DIRECT_QLEN = 1000  # packets HTB's direct queue holds (unmarked RoCE-class packets: ACKs)

# rtnetlink constants (linux/rtnetlink.h, linux/netlink.h, linux/pkt_sched.h)
RTM_NEWLINK, RTM_GETLINK, RTM_NEWQDISC, RTM_NEWTCLASS = 16, 18, 36, 40
NLMSG_ERROR = 2
NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE = 0x1, 0x4, 0x200, 0x400
NLM_F_CAPPED, NLM_F_ACK_TLVS = 0x100, 0x200
SOL_NETLINK, NETLINK_CAP_ACK, NETLINK_EXT_ACK = 270, 10, 11
NLMSGERR_ATTR_MSG = 1
IFLA_IFNAME = 3
TCA_KIND, TCA_OPTIONS = 1, 2
TCA_HTB_PARMS, TCA_HTB_INIT, TCA_HTB_DIRECT_QLEN, TCA_HTB_RATE64, TCA_HTB_CEIL64 = 1, 2, 5, 6, 7
TC_LINKLAYER_ETHERNET = 1
TC_HTB_PROTOVER = 3
HTB_RATE2QUANTUM = 10

_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, seq, pid
# One HTB class message: nlmsghdr, tcmsg (family, ifindex, handle, parent, info), TCA_KIND "htb",
# TCA_OPTIONS { TCA_HTB_PARMS tc_htb_opt (rate and ceil tc_ratespecs: cell_log, linklayer,
# overhead, cell_align, mpu, rate; buffer, cbuffer, quantum, level, prio), TCA_HTB_RATE64,
# TCA_HTB_CEIL64 }. The 64-bit rates are always sent: the kernel takes max(u32 rate, rate64).
_CLASS = struct.Struct("=IHHII BxxxiIII HH4s HH HH BBHhHI BBHhHI IIIII HHQ HHQ")
_OPTIONS_LEN = 4 + (4 + 44) + 12 + 12  # TCA_OPTIONS, its header included
_KIND = b"htb\0"
assert _CLASS.size == 16 + 20 + 8 + _OPTIONS_LEN


def qp_mark(k: int) -> int:
    """The SO_MARK of the host's k-th queue pair, also the minor of its class 30:<mark>."""
    if not 0 <= k <= QP_MAX:
        raise ValueError(f"queue pair index {k} outside 0..{QP_MAX}")
    return QP_MINOR_BASE + k


def qp_class(k: int) -> int:
    """The HTB class id of the host's k-th queue pair."""
    return QP_MAJOR | qp_mark(k)


def psched_ticks(seconds: float) -> int:
    """A duration in psched ticks, the unit of HTB's buffer/cbuffer, with pyroute2's (and
    iproute2's) ticks per microsecond from /proc/net/psched. Unlike them we do not truncate to
    whole microseconds first: two frames last less than that above ~3 GB/s."""
    return int(seconds * 1e6 * tick_in_usec)


def _attr(kind: int, payload: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(payload), kind) + payload
    return raw + b"\0" * (-len(raw) % 4)


def _message(kind: int, flags: int, body: bytes, seq: int = 0) -> bytes:
    return _HEADER.pack(_HEADER.size + len(body), kind, flags, seq, 0) + body


def _tcmsg(ifindex: int, handle: int, parent: int) -> bytes:
    return struct.pack("=BxxxiIII", socket.AF_UNSPEC, ifindex, handle, parent, 0)


def _check_ack(sock: socket.socket, seq: int, what: str) -> None:
    """Read up to the kernel's answer to request seq; raise OSError if it refused."""
    while True:
        data = sock.recv(65536)
        _, kind, flags, got_seq, _ = _HEADER.unpack_from(data)
        if kind == NLMSG_ERROR and got_seq == seq:
            break
    error = struct.unpack_from("=i", data, 16)[0]
    if not error:
        return
    detail = ""
    if flags & NLM_F_ACK_TLVS:  # extended ack: the kernel's own message, if any
        at = 20 + (16 if flags & NLM_F_CAPPED else struct.unpack_from("=I", data, 20)[0])
        while at + 4 <= len(data):
            length, kind = struct.unpack_from("=HH", data, at)
            if length < 4:
                break
            if kind == NLMSGERR_ATTR_MSG:
                detail = " (" + data[at + 4:at + length].rstrip(b"\0").decode(errors="replace") + ")"
            at += (length + 3) & ~3
    raise OSError(-error, f"{what}: {os.strerror(-error)}{detail}")


def _ask_for_details(sock: socket.socket) -> None:
    """Errors come with the kernel's message and without a copy of our request."""
    for option in (NETLINK_EXT_ACK, NETLINK_CAP_ACK):
        try:
            sock.setsockopt(SOL_NETLINK, option, 1)
        except OSError:
            pass


def link_index(sock: socket.socket, ifname: str) -> int:
    """The ifindex of ifname in the namespace of the rtnetlink socket sock."""
    body = struct.pack("=BxHiII", socket.AF_UNSPEC, 0, 0, 0, 0) + _attr(IFLA_IFNAME, ifname.encode() + b"\0")
    sock.send(_message(RTM_GETLINK, NLM_F_REQUEST, body, seq=1))
    while True:
        data = sock.recv(65536)
        _, kind, _, seq, _ = _HEADER.unpack_from(data)
        if kind == RTM_NEWLINK and seq == 1:
            return struct.unpack_from("=i", data, 20)[0]
        if kind == NLMSG_ERROR and seq == 1:
            error = -struct.unpack_from("=i", data, 16)[0] or errno.ENODEV
            raise OSError(error, f"no interface {ifname!r}: {os.strerror(error)}")


def install(sock: socket.socket, ifindex: int, parent: int, direct_qlen: int = DIRECT_QLEN) -> None:
    """Create the empty QP HTB 30: (default class 0: the direct queue) under class `parent`."""
    options = (_attr(TCA_HTB_INIT, struct.pack("=IIIII", TC_HTB_PROTOVER, HTB_RATE2QUANTUM, 0, 0, 0))
               + _attr(TCA_HTB_DIRECT_QLEN, struct.pack("=I", direct_qlen)))
    body = _tcmsg(ifindex, QP_MAJOR, parent) + _attr(TCA_KIND, _KIND) + _attr(TCA_OPTIONS, options)
    _ask_for_details(sock)
    sock.send(_message(RTM_NEWQDISC, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, body, seq=1))
    _check_ack(sock, 1, f"ifindex {ifindex}: QP qdisc {QP_MAJOR >> 16:x}: not created")


class QpLimiter:
    """The per-QP rate classes of one host NIC, over one raw rtnetlink socket of the host's
    namespace (queues.netlink_socket). Not thread-safe: one caller per socket."""

    def __init__(self, sock: socket.socket, ifindex: int, mtu: int, *, ifname: str | None = None):
        self.sock = sock
        self.ifindex = ifindex
        self.frame = mtu + shaping.ETH_HEADER  # mtu: the link's IP MTU
        self.name = ifname or f"ifindex {ifindex}"
        self._seq = 1
        _ask_for_details(sock)

    def add(self, k: int, rate_bps: float) -> None:
        """Create queue pair k's class at rate_bps (emulated bit/s), or take over the one an
        earlier traffic phase on this host left (a job run alone before the jobs together)."""
        self._send(k, rate_bps, NLM_F_CREATE, "not created")

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
        burst = BURST_FRAMES * self.frame
        ticks = psched_ticks(min(burst / rate, MAX_BURST_TIME_S))
        rate32 = min(rate, 0xFFFFFFFF)
        self._seq = seq = self._seq % 0xFFFFFFFF + 1
        self.sock.send(_CLASS.pack(
            _CLASS.size, RTM_NEWTCLASS, NLM_F_REQUEST | NLM_F_ACK | flags, seq, 0,
            socket.AF_UNSPEC, self.ifindex, classid, QP_MAJOR, 0,
            8, TCA_KIND, _KIND,
            _OPTIONS_LEN, TCA_OPTIONS,
            4 + 44, TCA_HTB_PARMS,
            0, TC_LINKLAYER_ETHERNET, 0, -1, 0, rate32,  # rate
            0, TC_LINKLAYER_ETHERNET, 0, -1, 0, rate32,  # ceil
            ticks, ticks, self.frame, 0, 0,  # buffer, cbuffer, quantum, level, prio
            12, TCA_HTB_RATE64, rate,
            12, TCA_HTB_CEIL64, rate))
        _check_ack(self.sock, seq, f"{self.name}: class {classid >> 16:x}:{classid & 0xFFFF:x} {failure}")
