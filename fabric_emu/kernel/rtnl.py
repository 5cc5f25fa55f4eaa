"""Raw rtnetlink messages for traffic control, built with struct and sent on a plain socket.

pyroute2's tc() costs ~1.3-1.7 ms a call (argument processing, lookups, its asyncio plumbing);
the same request built here costs microseconds, which matters where there are many: every link
end's class tree at start-up (fabric_emu.ports.queues.shape_all), a queue pair's rate many times
a second (fabric_emu.ports.qp_limiter). Rates are given with an "Ethernet" link layer, so the
kernel needs no rate table (HTB and TBF read one only for TC_LINKLAYER_UNAWARE). Layouts are
the kernel's uapi structs (linux/netlink.h, linux/rtnetlink.h, linux/pkt_sched.h).
"""

from __future__ import annotations

import errno
import os
import socket
import struct

from pyroute2.netlink.rtnl.tcmsg.common import tick_in_usec

from fabric_emu.kernel.shaping import netlink_fd_in

RTM_NEWLINK, RTM_GETLINK = 16, 18
RTM_NEWQDISC, RTM_DELQDISC, RTM_GETQDISC, RTM_NEWTCLASS, RTM_NEWTFILTER = 36, 37, 38, 40, 44
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE, NLM_F_DUMP = 0x1, 0x4, 0x200, 0x400, 0x300
NLM_F_CAPPED, NLM_F_ACK_TLVS = 0x100, 0x200
SOL_NETLINK, NETLINK_CAP_ACK, NETLINK_EXT_ACK = 270, 10, 11
NLMSGERR_ATTR_MSG = 1
IFLA_IFNAME, IFLA_MTU = 3, 4
TC_H_ROOT = 0xFFFFFFFF
TC_H_CLSACT = 0xFFFFFFF1  # also TC_H_INGRESS
CLSACT_HANDLE = 0xFFFF0000
ETH_P_ALL = 3
TCA_KIND, TCA_OPTIONS = 1, 2
TCA_HTB_PARMS, TCA_HTB_INIT, TCA_HTB_DIRECT_QLEN, TCA_HTB_RATE64, TCA_HTB_CEIL64 = 1, 2, 5, 6, 7
TCA_TBF_PARMS, TCA_TBF_BURST = 1, 6
TCA_BPF_CLASSID, TCA_BPF_FD, TCA_BPF_NAME, TCA_BPF_FLAGS = 3, 6, 7, 8
TCA_BPF_FLAG_ACT_DIRECT = 1
TC_LINKLAYER_ETHERNET = 1
TC_HTB_PROTOVER = 3
HTB_RATE2QUANTUM = 10
CREATE = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL  # a new qdisc or class
CHANGE = NLM_F_REQUEST | NLM_F_ACK  # an existing one, in place

HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, seq, pid
_RATESPEC = struct.Struct("=BBHhHI")  # tc_ratespec: cell_log, linklayer, overhead, cell_align, mpu, rate
SEQ_OFFSET = 8  # of nlmsghdr.seq in a message
IFINDEX_OFFSET = HEADER.size + 4  # of tcmsg.tcm_ifindex, after family and padding


def netlink_socket(netns: str | None = None) -> socket.socket:
    """A raw rtnetlink socket inside netns (None: this namespace), bound and ready to send."""
    if netns is None:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
    else:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, fileno=netlink_fd_in(netns))
    sock.bind((0, 0))
    return sock


def psched_ticks(seconds: float) -> int:
    """A duration in psched ticks, the unit of HTB's buffer/cbuffer, with pyroute2's (and
    iproute2's) ticks per microsecond from /proc/net/psched. Unlike them we do not truncate to
    whole microseconds first: two frames last less than that above ~3 GB/s."""
    return int(seconds * 1e6 * tick_in_usec)


def attr(kind: int, payload: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(payload), kind) + payload
    return raw + b"\0" * (-len(raw) % 4)


def message(kind: int, flags: int, body: bytes, seq: int = 0) -> bytes:
    return HEADER.pack(HEADER.size + len(body), kind, flags, seq, 0) + body


def tcmsg(ifindex: int, handle: int, parent: int, info: int = 0) -> bytes:
    return struct.pack("=BxxxiIII", socket.AF_UNSPEC, ifindex, handle, parent, info)


def ratespec(rate_Bps: int) -> bytes:
    """A rate (bytes/s, capped to u32: the 64-bit attribute carries the rest), Ethernet link layer."""
    return _RATESPEC.pack(0, TC_LINKLAYER_ETHERNET, 0, -1, 0, min(rate_Bps, 0xFFFFFFFF))


def htb_qdisc(ifindex: int, handle: int, parent: int, default_minor: int,
              direct_qlen: int | None = None) -> bytes:
    """RTM_NEWQDISC body of an HTB (unclassified packets go to class handle:default_minor; 0
    is HTB's direct queue)."""
    options = attr(TCA_HTB_INIT, struct.pack("=IIIII", TC_HTB_PROTOVER, HTB_RATE2QUANTUM, default_minor, 0, 0))
    if direct_qlen is not None:
        options += attr(TCA_HTB_DIRECT_QLEN, struct.pack("=I", direct_qlen))
    return tcmsg(ifindex, handle, parent) + attr(TCA_KIND, b"htb\0") + attr(TCA_OPTIONS, options)


def htb_class(ifindex: int, classid: int, parent: int, rate_Bps: int, ceil_Bps: int, burst: int,
              cburst: int, quantum: int, prio: int = 0) -> bytes:
    """RTM_NEWTCLASS body of an HTB class: rate and ceil in bytes/s, buckets in bytes. The 64-bit
    rates are always sent: the kernel takes max(u32 rate, rate64)."""
    parms = (ratespec(rate_Bps) + ratespec(ceil_Bps)
             + struct.pack("=IIIII", psched_ticks(burst / rate_Bps), psched_ticks(cburst / ceil_Bps),
                           quantum, 0, prio))
    options = (attr(TCA_HTB_PARMS, parms) + attr(TCA_HTB_RATE64, struct.pack("=Q", rate_Bps))
               + attr(TCA_HTB_CEIL64, struct.pack("=Q", ceil_Bps)))
    return tcmsg(ifindex, classid, parent) + attr(TCA_KIND, b"htb\0") + attr(TCA_OPTIONS, options)


def tbf_qdisc(ifindex: int, handle: int, parent: int, rate_Bps: int, burst: int, limit: int) -> bytes:
    """RTM_NEWQDISC body of a TBF: rate in bytes/s (u32), burst in bytes (TCA_TBF_BURST, so any
    frame up to it passes at any rate), limit in bytes (of the default bfifo it creates below)."""
    if rate_Bps > 0xFFFFFFFF:
        raise ValueError(f"TBF rate {rate_Bps} B/s does not fit 32 bits")
    parms = ratespec(rate_Bps) + bytes(_RATESPEC.size) + struct.pack("=III", limit, 0, 0)
    options = attr(TCA_TBF_PARMS, parms) + attr(TCA_TBF_BURST, struct.pack("=I", burst))
    return tcmsg(ifindex, handle, parent) + attr(TCA_KIND, b"tbf\0") + attr(TCA_OPTIONS, options)


def bfifo_qdisc(ifindex: int, handle: int, parent: int, limit: int) -> bytes:
    """RTM_NEWQDISC body of a byte FIFO of `limit` bytes (tc_fifo_qopt)."""
    return (tcmsg(ifindex, handle, parent) + attr(TCA_KIND, b"bfifo\0")
            + attr(TCA_OPTIONS, struct.pack("=I", limit)))


def clsact_qdisc(ifindex: int) -> bytes:
    """RTM_NEWQDISC body of clsact: the ingress and egress hooks tc-BPF programs attach to."""
    return tcmsg(ifindex, CLSACT_HANDLE, TC_H_CLSACT) + attr(TCA_KIND, b"clsact\0")


def bpf_filter(ifindex: int, parent: int, prog_fd: int, name: str, classid: int, handle: int = 1) -> bytes:
    """RTM_NEWTFILTER body of a cls_bpf filter in direct-action mode, for every protocol, at the
    priority the kernel picks (the first filter of a hook gets 49152)."""
    options = (attr(TCA_BPF_CLASSID, struct.pack("=I", classid)) + attr(TCA_BPF_FD, struct.pack("=I", prog_fd))
               + attr(TCA_BPF_NAME, name.encode() + b"\0")
               + attr(TCA_BPF_FLAGS, struct.pack("=I", TCA_BPF_FLAG_ACT_DIRECT)))
    info = socket.htons(ETH_P_ALL)  # priority 0 in the upper half: the kernel chooses
    return tcmsg(ifindex, handle, parent, info) + attr(TCA_KIND, b"bpf\0") + attr(TCA_OPTIONS, options)


def qdisc_handles(sock: socket.socket, ifindex: int) -> set[int]:
    """The handles of every qdisc of one interface (a dump of the namespace's, filtered)."""
    sock.send(message(RTM_GETQDISC, NLM_F_REQUEST | NLM_F_DUMP, tcmsg(0, 0, 0), seq=1))
    handles: set[int] = set()
    while True:
        data = sock.recv(1 << 16)
        at = 0
        while at + HEADER.size <= len(data):
            length, kind, _, _, _ = HEADER.unpack_from(data, at)
            if kind == NLMSG_DONE:
                return handles
            if kind == NLMSG_ERROR:
                error = -struct.unpack_from("=i", data, at + HEADER.size)[0]
                raise OSError(error, f"ifindex {ifindex}: qdiscs not listed: {os.strerror(error)}")
            if kind == RTM_NEWQDISC:
                _, index, handle, _, _ = struct.unpack_from("=BxxxiIII", data, at + HEADER.size)
                if index == ifindex:
                    handles.add(handle)
            at += (length + 3) & ~3


def root_qdisc_delete(ifindex: int) -> bytes:
    """RTM_DELQDISC body: the interface's root qdisc (ENOENT when it has only the default)."""
    return tcmsg(ifindex, 0, TC_H_ROOT)


def mtu_change(ifindex: int, mtu: int) -> bytes:
    """RTM_NEWLINK body: set an interface's MTU."""
    return struct.pack("=BxHiII", socket.AF_UNSPEC, 0, ifindex, 0, 0) + attr(IFLA_MTU, struct.pack("=I", mtu))


def error_of(data: bytes, flags: int) -> tuple[int, str]:
    """(errno, the kernel's own message or "") of an NLMSG_ERROR message."""
    error = -struct.unpack_from("=i", data, HEADER.size)[0]
    detail = ""
    if error and flags & NLM_F_ACK_TLVS:  # extended ack: the kernel's own message, if any
        at = HEADER.size + 4 + (HEADER.size if flags & NLM_F_CAPPED else struct.unpack_from("=I", data, 20)[0])
        while at + 4 <= len(data):
            length, kind = struct.unpack_from("=HH", data, at)
            if length < 4:
                break
            if kind == NLMSGERR_ATTR_MSG:
                detail = data[at + 4:at + length].rstrip(b"\0").decode(errors="replace")
            at += (length + 3) & ~3
    return error, detail


def check_ack(sock: socket.socket, seq: int, what: str) -> None:
    """Read up to the kernel's answer to request seq; raise OSError if it refused."""
    while True:
        data = sock.recv(65536)
        _, kind, flags, got_seq, _ = HEADER.unpack_from(data)
        if kind == NLMSG_ERROR and got_seq == seq:
            break
    error, detail = error_of(data, flags)
    if error:
        raise OSError(error, f"{what}: {os.strerror(error)}" + (f" ({detail})" if detail else ""))


def ask_for_details(sock: socket.socket) -> None:
    """Errors come with the kernel's message and without a copy of our request."""
    for option in (NETLINK_EXT_ACK, NETLINK_CAP_ACK):
        try:
            sock.setsockopt(SOL_NETLINK, option, 1)
        except OSError:
            pass


def link_index(sock: socket.socket, ifname: str) -> int:
    """The ifindex of ifname in the namespace of the rtnetlink socket sock."""
    body = struct.pack("=BxHiII", socket.AF_UNSPEC, 0, 0, 0, 0) + attr(IFLA_IFNAME, ifname.encode() + b"\0")
    sock.send(message(RTM_GETLINK, NLM_F_REQUEST, body, seq=1))
    while True:
        data = sock.recv(65536)
        _, kind, _, seq, _ = HEADER.unpack_from(data)
        if kind == RTM_NEWLINK and seq == 1:
            return struct.unpack_from("=i", data, 20)[0]
        if kind == NLMSG_ERROR and seq == 1:
            error = -struct.unpack_from("=i", data, 16)[0] or errno.ENODEV
            raise OSError(error, f"no interface {ifname!r}: {os.strerror(error)}")


class Batch:
    """Requests for one namespace's rtnetlink socket, sent in order and acknowledged one by one.

    Each request is (message type, flags, body, what it does, errnos that are fine); send()
    stops at the first refusal with an OSError naming it."""

    def __init__(self) -> None:
        self.requests: list[tuple[int, int, bytes, str, frozenset[int]]] = []

    def add(self, kind: int, flags: int, body: bytes, what: str, ok_errors: frozenset[int] = frozenset()) -> None:
        self.requests.append((kind, flags, body, what, ok_errors))

    def send(self, sock: socket.socket, first_seq: int = 1) -> None:
        ask_for_details(sock)
        for seq, (kind, flags, body, what, ok_errors) in enumerate(self.requests, first_seq):
            sock.send(message(kind, flags, body, seq))
            try:
                check_ack(sock, seq, what)
            except OSError as e:
                if e.errno not in ok_errors:
                    raise
