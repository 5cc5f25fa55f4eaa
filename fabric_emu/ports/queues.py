"""Traffic classes on an egress port: one HTB tree per link end, configured over netlink.

Every shaped link end (switch port or host NIC) gets::

    root htb 1: (default 1:10)
      class 1:1   rate = ceil = link rate                     (the wire)
        class 1:16  prio 0, rate 1% of the link, ceil link  -> bfifo 16:   priority 6, CNPs
        class 1:13  prio 1, rate ~1/2,  ceil link           -> tbf 13:     priority 3, RoCE
        class 1:10  prio 1, rate ~1/2,  ceil link           -> bfifo 10:   priority 0, the rest

and a host NIC's PFC gate holds per-queue-pair rate classes instead of a FIFO
(fabric_emu.ports.qp_limiter)::

        class 1:13 -> tbf 13: (the gate) -> class 13:1 -> htb 30: (default 0: direct queue)
                                                           class 30:100 + k  rate = ceil = QP k's rate
                                                             -> pfifo (default)

A tc-BPF program on the port's egress hook puts each packet in its class by setting
skb->priority to the class id (HTB takes skb->priority as the class when it names one of its
leaves), so no tc classifier runs. HTB serves the lowest `prio` first when classes borrow, which
makes the CNP class strict-priority; RoCE and the default class split the rest evenly when both
are backlogged (ETS with equal weights, as NVIDIA's RoCE QoS profile does with DWRR 50%). On a
host NIC, htb 30: has a filter, the qp_classify program, which picks queue pair k's class from
the socket mark; packets without one (ACKs) wait in HTB's direct queue, which it serves first.

The RoCE class's qdisc is a TBF used as a PFC gate (DESIGN.md §3): open, its rate is well above
the link's and it never limits; closed, its rate is 64 bit/s, so it dequeues nothing and the
class holds its packets while the other classes borrow the whole link. Changing a TBF resets its
bucket, so one frame already granted tokens may still leave at the moment of the pause, like the
frame a real MAC is transmitting when the pause arrives. Under a closed gate the queue pairs'
packets wait in HTB 30:, one of them (the one the TBF peeked at) already charged to its class
and set aside until the gate opens.

The byte limits of the class FIFOs are a backstop: the BPF program does admission (tail drop
per class, or per ingress port for the lossless class) on its own accounting, with the limits
the plan gives, so these FIFOs are sized never to be the first to drop. On a host NIC the TBF's
limit no longer applies (the kernel sets it only on a FIFO child): what waits there is bounded
by each queue pair's socket buffer and by the direct queue's DIRECT_QLEN packets. The TBF's
statistics include everything below it, so class_stats reads the same RoCE backlog either way.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

import errno
import os
import socket
import struct

from pyroute2.netlink import NLM_F_ACK, NLM_F_REQUEST
from pyroute2.netlink.rtnl import RTM_NEWQDISC
from pyroute2.netlink.rtnl.tcmsg import tcmsg
from pyroute2.netlink.rtnl.tcmsg import plugins as tc_plugins
from pyroute2.netlink.rtnl.tcmsg import sched_tbf
from pyroute2.netlink.rtnl.tcmsg.common import get_rate_parameters

from fabric_emu.kernel import rtnl, shaping
from fabric_emu.kernel.rtnl import Batch
from fabric_emu.ports import qp_limiter
from fabric_emu.kernel.shaping import IPRoutePool, borrowed, link_index

PRIORITIES = (0, 3, 6)  # the classes every port has: default, RoCE (lossless), CNP
LOSSLESS = 3
CNP = 6
HTB_MAJOR = 0x10000
ROOT_CLASS = 0x10001
CLASS_MINOR_BASE = 0x10
CNP_SHARE = 0.01
GATE_OPEN_FACTOR = 4  # open gate rate, in link rates
GATE_CLOSED_BYTES_PER_S = 8  # 64 bit/s: pyroute2's rate table overflows below ~7.5 B/s
U32_MAX = 2**32 - 1


def class_id(prio: int) -> int:
    """HTB class id of a priority (1:10 + prio), also the skb->priority the BPF program sets."""
    return HTB_MAJOR | (CLASS_MINOR_BASE + prio)


def qdisc_handle(prio: int) -> int:
    """Handle of the qdisc under a priority's class: 10:, 13:, 16:."""
    return (CLASS_MINOR_BASE + prio) << 16


GATE_CLASS = qdisc_handle(LOSSLESS) | 1  # 13:1, the PFC gate's (TBF's) only class


def _tbf_parameters(kwarg: dict) -> dict:
    """pyroute2's TBF options plus TCA_TBF_BURST (bytes), which pyroute2 0.9.7 does not send.

    Without it the kernel takes the bucket from the legacy u32 `buffer` (psched ticks, capped at
    ~4.3 s), so a closed gate at 64 bit/s would allow only a 34-byte packet and DROP every frame
    that arrives while paused. With it the largest packet is the burst, at any rate."""
    burst = kwarg["burst"]
    # The legacy fields still have to fit their u32s: give them a bucket of at most 100 s.
    legacy = dict(kwarg, burst=min(burst, max(1, int(kwarg["rate"] * 100))))
    parms = get_rate_parameters(legacy)
    return {"attrs": [["TCA_TBF_PARMS", parms], ["TCA_TBF_RTAB", True], ["TCA_TBF_BURST", burst]]}


class tbf_burst_options(sched_tbf.options):
    nla_map = (
        ("TCA_TBF_UNSPEC", "none"),
        ("TCA_TBF_PARMS", "tbf_parms"),
        ("TCA_TBF_RTAB", "rtab"),
        ("TCA_TBF_PTAB", "ptab"),
        ("TCA_TBF_RATE64", "uint64"),
        ("TCA_TBF_PRATE64", "uint64"),
        ("TCA_TBF_BURST", "uint32"),
        ("TCA_TBF_PBURST", "uint32"),
        ("TCA_TBF_PAD", "none"),
    )


class _TbfPlugin:
    """A pyroute2 tc plugin: sched_tbf with the options above."""

    parent = sched_tbf.parent
    fix_request = staticmethod(sched_tbf.fix_request)
    get_parameters = staticmethod(_tbf_parameters)
    options = tbf_burst_options


tc_plugins["tbf"] = _TbfPlugin


@dataclass(frozen=True)
class PortQueues:
    """One link end's classes: its rate and the backstop byte limit of each class FIFO."""

    ifname: str
    rate_bps: float
    mtu: int
    limits: dict[int, int]  # priority -> bytes
    netns: str | None = None
    qp_classes: bool = False  # host NICs: per-queue-pair rate classes inside the PFC gate


def _leaf_params(rate_Bps: int, ceil_Bps: int, frame: int, prio: int) -> dict[str, int]:
    def bucket(r: int) -> int:
        b = max(shaping.BURST_MIN_FRAMES * frame, round(r * shaping.BURST_TIME_S))
        return min(b, int(r * shaping.MAX_BURST_TIME_S))

    return {"rate": rate_Bps, "ceil": ceil_Bps, "burst": bucket(rate_Bps), "cburst": bucket(ceil_Bps),
            "mtu": frame, "quantum": frame, "prio": prio}


def _shares(link_Bps: int) -> dict[int, int]:
    cnp = max(shaping.MIN_RATE_BYTES_PER_S, round(link_Bps * CNP_SHARE))
    rest = max(2 * shaping.MIN_RATE_BYTES_PER_S, link_Bps - cnp)
    return {CNP: cnp, LOSSLESS: rest // 2, 0: rest - rest // 2}


def _gate_params(link_Bps: int, frame: int, limit: int, is_open: bool) -> dict[str, int]:
    if is_open:
        rate = min(U32_MAX, GATE_OPEN_FACTOR * link_Bps)
        burst = max(16 * frame, round(rate * shaping.BURST_TIME_S))
    else:
        rate, burst = GATE_CLOSED_BYTES_PER_S, frame
    return {"rate": rate, "burst": burst, "limit": limit}


def tree_batch(port: PortQueues, index: int) -> Batch:
    """The requests that replace the port's root qdisc with the class tree above (gate open;
    with port.qp_classes, the empty HTB 30: in the gate)."""
    link = max(shaping.MIN_RATE_BYTES_PER_S, round(port.rate_bps / 8))
    frame = port.mtu + shaping.ETH_HEADER
    where = f"{port.ifname}" + (f" in {port.netns}" if port.netns else "")
    b = Batch()
    b.add(rtnl.RTM_DELQDISC, rtnl.CHANGE, rtnl.root_qdisc_delete(index), f"{where}: root qdisc not deleted",
          frozenset({errno.ENOENT}))  # ENOENT: only the default root (noqueue, handle 0)
    b.add(rtnl.RTM_NEWQDISC, rtnl.CREATE, rtnl.htb_qdisc(index, HTB_MAJOR, rtnl.TC_H_ROOT, CLASS_MINOR_BASE),
          f"{where}: htb 1: not created")
    root = shaping.class_params(port.rate_bps, port.mtu)
    b.add(rtnl.RTM_NEWTCLASS, rtnl.CREATE, rtnl.htb_class(index, ROOT_CLASS, HTB_MAJOR, root["rate"], root["ceil"],
                                                          root["burst"], root["cburst"], root["quantum"]),
          f"{where}: class 1:1 not created")
    for prio, rate in _shares(link).items():
        p = _leaf_params(rate, link, frame, 0 if prio == CNP else 1)
        b.add(rtnl.RTM_NEWTCLASS, rtnl.CREATE,
              rtnl.htb_class(index, class_id(prio), ROOT_CLASS, p["rate"], p["ceil"], p["burst"], p["cburst"],
                             p["quantum"], p["prio"]),
              f"{where}: class 1:{CLASS_MINOR_BASE + prio:x} not created")
        limit = port.limits[prio]
        if prio == LOSSLESS:
            g = _gate_params(link, frame, limit, is_open=True)
            b.add(rtnl.RTM_NEWQDISC, rtnl.CREATE,
                  rtnl.tbf_qdisc(index, qdisc_handle(prio), class_id(prio), g["rate"], g["burst"], g["limit"]),
                  f"{where}: the PFC gate (tbf {CLASS_MINOR_BASE + prio:x}:) not created")
            if port.qp_classes:
                b.add(rtnl.RTM_NEWQDISC, rtnl.CREATE, qp_limiter.qp_qdisc(index, GATE_CLASS),
                      f"{where}: QP qdisc {qp_limiter.QP_MAJOR >> 16:x}: not created")
        else:
            b.add(rtnl.RTM_NEWQDISC, rtnl.CREATE, rtnl.bfifo_qdisc(index, qdisc_handle(prio), class_id(prio), limit),
                  f"{where}: bfifo {CLASS_MINOR_BASE + prio:x}: not created")
    return b


def shape_all(ports: Iterable[PortQueues]) -> None:
    """shape_classes for many link ends: one raw rtnetlink socket per namespace, about ten
    requests a link end sent on it in order (~0.1 ms an end, where pyroute2's nine tc() calls
    took ~5 ms: most of a large fabric's start-up over raw Mininet's)."""
    by_netns: dict[str | None, list[PortQueues]] = defaultdict(list)
    for port in ports:
        by_netns[port.netns].append(port)
    for netns, group in by_netns.items():
        sock = rtnl.netlink_socket(netns)
        try:
            for port in group:
                tree_batch(port, rtnl.link_index(sock, port.ifname)).send(sock)
        finally:
            sock.close()


def shape_classes(port: PortQueues) -> None:
    """Replace one port's root qdisc with the class tree above (see tree_batch)."""
    shape_all([port])


def set_link_rate(ifname: str, rate_bps: float, mtu: int, netns: str | None = None, *,
                  pool: IPRoutePool | None = None) -> None:
    """Change a link end's rate in place (a link renegotiated to another speed): the root class
    and each class's share, as shape_classes set them; queued packets stay. The PFC gate's open
    rate stays above any link rate it will see, so it needs no change."""
    link = max(shaping.MIN_RATE_BYTES_PER_S, round(rate_bps / 8))
    frame = mtu + shaping.ETH_HEADER
    with borrowed(pool) as p:
        ipr = p.get(netns)
        index = link_index(ipr, ifname)
        ipr.tc("change-class", "htb", index, ROOT_CLASS, parent=HTB_MAJOR, **shaping.class_params(rate_bps, mtu))
        for prio, rate in _shares(link).items():
            ipr.tc("change-class", "htb", index, class_id(prio), parent=ROOT_CLASS,
                   **_leaf_params(rate, link, frame, 0 if prio == CNP else 1))


def set_gate(ifname: str, rate_bps: float, mtu: int, limit: int, is_open: bool,
             netns: str | None = None, *, pool: IPRoutePool | None = None) -> None:
    """Open or close the lossless class's PFC gate in place (queued packets stay)."""
    link = max(shaping.MIN_RATE_BYTES_PER_S, round(rate_bps / 8))
    with borrowed(pool) as p:
        ipr = p.get(netns)
        ipr.tc("change", "tbf", link_index(ipr, ifname), qdisc_handle(LOSSLESS),
               parent=class_id(LOSSLESS), **_gate_params(link, mtu + shaping.ETH_HEADER, limit, is_open))


class Gate:
    """One port's PFC gate, switched by pre-encoded netlink messages on a raw rtnetlink socket
    of the port's namespace (shared by the gates of that namespace): ~5 us a switch, where
    pyroute2's tc() takes ~1.7 ms (its lookups and asyncio plumbing), and every microsecond
    here is headroom a pause consumes."""

    def __init__(self, sock: socket.socket, ifname: str, index: int, rate_bps: float, mtu: int, limit: int):
        self.sock = sock
        self.ifname = ifname
        self.index = index
        link = max(shaping.MIN_RATE_BYTES_PER_S, round(rate_bps / 8))
        frame = mtu + shaping.ETH_HEADER
        self.msgs = {is_open: self._encode(index, _gate_params(link, frame, limit, is_open))
                      for is_open in (True, False)}

    @staticmethod
    def _encode(index: int, params: dict[str, int]) -> bytes:
        msg = tcmsg()
        msg["index"], msg["handle"], msg["parent"] = index, qdisc_handle(LOSSLESS), class_id(LOSSLESS)
        msg["attrs"] = [["TCA_KIND", "tbf"], ["TCA_OPTIONS", _tbf_parameters(params)]]
        msg["header"]["type"] = RTM_NEWQDISC
        msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK  # change: no CREATE, no EXCL
        msg.encode()
        return bytes(msg.data)

    def set(self, is_open: bool) -> None:
        self.sock.send(self.msgs[is_open])
        ack = self.sock.recv(65536)
        error = struct.unpack_from("=i", ack, 16)[0]  # nlmsgerr after the 16-byte header
        if error:
            raise OSError(-error, f"{self.ifname}: gate change refused: {os.strerror(-error)}")


@dataclass(frozen=True)
class ClassStats:
    """One class of one port: sent by its HTB class; drops and backlog of its qdisc."""

    bytes: int
    packets: int
    drops: int
    backlog_bytes: int
    backlog_packets: int


def class_stats(ifname: str, netns: str | None = None, *,
                pool: IPRoutePool | None = None) -> dict[int, ClassStats]:
    """Kernel counters of every class of a port shaped by shape_classes."""
    with borrowed(pool) as p:
        ipr = p.get(netns)
        index = link_index(ipr, ifname)
        classes = {c["handle"]: c.get_attr("TCA_STATS2") for c in ipr.get_classes(index)}
        out = {}
        for prio in PRIORITIES:
            q = ipr.tc("get", index=index, handle=qdisc_handle(prio), parent=class_id(prio))[0]
            queue = q.get_attr("TCA_STATS2").get_attr("TCA_STATS_QUEUE")
            sent = classes[class_id(prio)].get_attr("TCA_STATS_BASIC")
            out[prio] = ClassStats(sent["bytes"], sent["packets"], queue["drops"],
                                   queue["backlog"], queue["qlen"])
    return out
