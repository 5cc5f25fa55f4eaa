"""Egress queues for emulated link ends, configured over rtnetlink with pyroute2 (no tc CLI).

Every link end gets the same tree::

    root htb 1: (default 1) --> class htb 1:1 (rate = ceil = link rate) --> bfifo 10: (limit = buffer bytes)

HTB paces the link at the emulated rate; the bfifo below it is the port's egress buffer, so
overflow is a tail drop counted by the kernel in the bfifo's drop counter.

pyroute2 0.9.7 quirks this module works around:

* It has no ``bfifo`` plugin (see ``pyroute2/netlink/rtnl/tcmsg/__init__.py``). A kind without
  a plugin is silently forced to ``parent=root`` and sent without options. The kernel's bfifo
  options are the same ``struct tc_fifo_qopt {u32 limit}`` as pfifo's (the kernel reads the
  limit as bytes for bfifo), so we register pyroute2's ``sched_pfifo`` plugin under ``bfifo``.
* An integer ``rate`` given to ``tc()`` means *bytes* per second (only strings like "20mbit"
  are bits), and the HTB ``buffer`` it computes is in psched ticks stored in a u32.
* ``IPRoute(netns=...)`` defaults to ``flags=O_CREAT`` (a missing named netns is silently
  created) and forks a helper process per socket (~10 ms). With hundreds of namespaces that
  dominates, so :func:`open_iproute` creates the socket in a short-lived thread that setns()
  into the namespace (setns switches only the calling thread) and hands the fd to IPRoute.
* ``tc("replace", "htb", ...)`` on an existing HTB root fails with EINVAL (HTB has no change
  operation), so shaping deletes the old root qdisc and builds the tree again.
* ``tc("get", ...)`` returns only the ACK unless the socket was opened with ``nlm_echo=True``
  (the kernel answers RTM_GETQDISC only to NLM_F_ECHO senders), and ``get_qdiscs(index)`` dumps
  every qdisc of the namespace and filters in Python. The sync ``nlm_request()`` is broken
  (KeyError 'nlm_generator'), so the echo socket is the way to read one qdisc cheaply.

txqueuelen is left alone: the bfifo has an explicit byte limit and HTB's default class catches
every packet, so the txqueuelen-derived limits (HTB direct queue, default fifo) never apply.
"""

from __future__ import annotations

import errno
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import TypeVar

from pyroute2 import IPRoute
from pyroute2 import netns as pr_netns
from pyroute2.netlink import NETLINK_ROUTE
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl.tcmsg import plugins as tc_plugins
from pyroute2.netlink.rtnl.tcmsg import sched_pfifo, tcmsg

T = TypeVar("T")

tc_plugins.setdefault("bfifo", sched_pfifo)

HTB_HANDLE = 0x10000  # 1:
CLASS_HANDLE = 0x10001  # 1:1
FIFO_HANDLE = 0x100000  # 10:
ETH_HEADER = 14  # qdiscs see the frame without FCS: MTU + Ethernet header

# HTB refills tokens only when its watchdog timer fires and NET_TX softirq runs; on a busy
# 2-core box that wakeup is regularly a millisecond or more late. Tokens beyond the bucket are
# lost meanwhile, so a bucket of one frame ran ~7% below rate at 100 Mb/s in our measurements,
# while a 2 ms bucket stayed within ~2%. A much bigger bucket would let long line-rate bursts
# through the "wire" and hide queue build-up downstream. So the bucket holds 2 ms of traffic,
# but never less than two full frames so that at low rates one MTU frame always fits and the
# next can follow back to back.
BURST_TIME_S = 2e-3
BURST_MIN_FRAMES = 2
# HTB stores times as psched ticks in a u32 (~274 s at 64 ns/tick). pyroute2 always sends the
# legacy rate table (time to send 8..2048 bytes), which overflows below ~7.5 bytes/s, so that is
# the lowest rate (64 bit/s, one 1500-byte frame per ~3 minutes: effectively paused). For the
# same reason the bucket's duration is capped.
MIN_RATE_BYTES_PER_S = 8
MAX_BURST_TIME_S = 60.0


@dataclass(frozen=True)
class QueueStats:
    """Egress queue counters: sent totals from HTB, drops/backlog from the bfifo (two reads, not atomic)."""

    bytes: int
    packets: int
    drops: int
    overlimits: int
    backlog_bytes: int
    backlog_packets: int


@dataclass(frozen=True)
class EgressPort:
    """One link end to shape, as taken by :func:`shape_all`."""

    ifname: str
    rate_bps: float
    buffer_bytes: int
    mtu: int
    netns: str | None = None


def open_iproute(netns: str | None = None) -> IPRoute:
    """Open an IPRoute in the root namespace, a named netns or a /proc/<pid>/ns/net path."""
    # nlm_echo: the kernel sends the answer to an RTM_GETQDISC "get" only to NLM_F_ECHO senders
    # (without it pyroute2 returns just the ACK). The alternative, a qdisc dump, is not filtered
    # by interface in the kernel and took ~20 ms per call with 200 ports in one namespace.
    if netns is None:
        return IPRoute(nlm_echo=True)
    return IPRoute(fileno=netlink_fd_in(netns), nlm_echo=True)


def run_in_netns(netns: str, fn: Callable[[], T]) -> T:
    """Run fn in a fresh thread switched into netns (a name or a /proc/<pid>/ns/net path).

    setns() switches only the calling thread; the thread dies afterwards, so none is left
    behind in a foreign namespace (a pooled thread would be). Sockets fn creates stay in netns
    wherever they are used from. Exceptions are re-raised in the caller's thread."""
    result: list[T] = []
    failure: list[BaseException] = []

    def target() -> None:
        try:
            # flags=0: fail on a missing namespace instead of pyroute2's default O_CREAT.
            pr_netns.setns(netns, flags=0, fork=False)
            result.append(fn())
        except BaseException as exc:
            failure.append(exc)

    worker = threading.Thread(target=target, name=f"netns {netns}")
    worker.start()
    worker.join()
    if failure:
        raise failure[0]
    return result[0]


def netlink_fd_in(netns: str) -> int:
    """Create a NETLINK_ROUTE socket inside netns and return its fd (never creates a netns)."""
    return run_in_netns(netns, lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM,
                                                     NETLINK_ROUTE).detach())


class IPRoutePool:
    """One IPRoute per namespace, opened on first use and closed together."""

    def __init__(self) -> None:
        self._iprs: dict[str | None, IPRoute] = {}

    def get(self, netns: str | None = None) -> IPRoute:
        """The IPRoute for netns (None = root namespace), opening it if needed."""
        if netns not in self._iprs:
            self._iprs[netns] = open_iproute(netns)
        return self._iprs[netns]

    def close(self) -> None:
        """Close every IPRoute of the pool."""
        for ipr in self._iprs.values():
            ipr.close()
        self._iprs.clear()

    def __enter__(self) -> IPRoutePool:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def shape_egress(
    ifname: str,
    rate_bps: float,
    buffer_bytes: int,
    mtu: int,
    netns: str | None = None,
    *,
    pool: IPRoutePool | None = None,
) -> None:
    """Replace ifname's root qdisc with HTB at rate_bps feeding a bfifo of buffer_bytes."""
    with borrowed(pool) as p:
        ipr = p.get(netns)
        index = link_index(ipr, ifname)
        delete_root_qdisc(ipr, index)
        # default = minor of 1:1, so every packet (also ARP, IPv6 ND) goes through the class.
        ipr.tc("add", "htb", index, HTB_HANDLE, default=CLASS_HANDLE & 0xFFFF)
        ipr.tc("add-class", "htb", index, CLASS_HANDLE, parent=HTB_HANDLE, **class_params(rate_bps, mtu))
        ipr.tc("add", "bfifo", index, FIFO_HANDLE, parent=CLASS_HANDLE, limit=buffer_bytes)


def shape_all(ports: Iterable[EgressPort]) -> None:
    """Shape many link ends, reusing one netlink socket per namespace."""
    with IPRoutePool() as pool:
        for port in ports:
            shape_egress(port.ifname, port.rate_bps, port.buffer_bytes, port.mtu, port.netns, pool=pool)


def set_rate(ifname: str, rate_bps: float, netns: str | None = None, *, pool: IPRoutePool | None = None) -> None:
    """Change the HTB class rate/ceil in place; queued packets stay in the bfifo."""
    with borrowed(pool) as p:
        ipr = p.get(netns)
        link = ipr.link("get", ifname=ifname)[0]  # its MTU sizes the bucket, as in shape_egress
        # "change-class" modifies the existing class (htb_change_class) without touching its
        # child qdisc, so the bfifo keeps its backlog; only rate, ceil and bucket change.
        # It also keeps the class's token balance, which makes a tiny rate a poor "pause": the
        # one packet HTB lets out at the tiny rate costs up to 60 s (HTB's cap on debt) of
        # tokens, and restoring the rate does not forgive that debt: the queue stays stuck for
        # up to a minute after the "resume" (measured ~60 s).
        ipr.tc(
            "change-class",
            "htb",
            link["index"],
            CLASS_HANDLE,
            parent=HTB_HANDLE,
            **class_params(rate_bps, link.get("mtu")),
        )


def egress_stats(ifname: str, netns: str | None = None, *, pool: IPRoutePool | None = None) -> QueueStats:
    """Read the queue counters of a link end shaped by :func:`shape_egress`."""
    with borrowed(pool) as p:
        ipr = p.get(netns)
        index = link_index(ipr, ifname)
        htb_class = _find(ipr.get_classes(index), CLASS_HANDLE, ifname).get_attr("TCA_STATS2")
        fifo = ipr.tc("get", index=index, handle=FIFO_HANDLE, parent=CLASS_HANDLE)[0].get_attr("TCA_STATS2")
    sent = htb_class.get_attr("TCA_STATS_BASIC")
    class_queue = htb_class.get_attr("TCA_STATS_QUEUE")
    fifo_queue = fifo.get_attr("TCA_STATS_QUEUE")
    return QueueStats(
        bytes=sent["bytes"],
        packets=sent["packets"],
        drops=fifo_queue["drops"],
        overlimits=class_queue["overlimits"],
        backlog_bytes=fifo_queue["backlog"],
        backlog_packets=fifo_queue["qlen"],
    )


@contextmanager
def borrowed(pool: IPRoutePool | None) -> Iterator[IPRoutePool]:
    """Yield the caller's pool, or a temporary one closed on exit."""
    if pool is not None:
        yield pool
        return
    with IPRoutePool() as own:
        yield own


def class_params(rate_bps: float, mtu: int) -> dict[str, int]:
    """HTB class keyword arguments for pyroute2's tc(): rate = ceil, bucket per the policy above."""
    rate = max(MIN_RATE_BYTES_PER_S, round(rate_bps / 8))  # bytes/s, as pyroute2 wants ints
    frame = mtu + ETH_HEADER
    burst = max(BURST_MIN_FRAMES * frame, round(rate * BURST_TIME_S))
    burst = min(burst, int(rate * MAX_BURST_TIME_S))
    return {
        "rate": rate,
        "ceil": rate,
        "burst": burst,
        "cburst": burst,
        "mtu": frame,
        # The quantum only splits bandwidth between sibling classes (there are none). Setting it
        # avoids the kernel's default rate/r2q, which logs "quantum of class is big" per class.
        "quantum": frame,
    }


def link_index(ipr: IPRoute, ifname: str) -> int:
    """Interface index of ifname, raising if the namespace has no such link."""
    indices = ipr.link_lookup(ifname=ifname)
    if not indices:
        raise LookupError(f"no interface {ifname!r}")
    return indices[0]


def delete_root_qdisc(ipr: IPRoute, index: int) -> None:
    """Delete the root qdisc of index, ignoring the errors of 'there is none to delete'."""
    try:
        ipr.tc("del", index=index, parent=0xFFFFFFFF)
    except NetlinkError as exc:
        if exc.code != errno.ENOENT:  # ENOENT: only the default root (noqueue, handle 0)
            raise


def _find(messages: Iterable[tcmsg], handle: int, ifname: str) -> tcmsg:
    """The tc message with the given handle, raising if ifname was not shaped by us."""
    for msg in messages:
        if msg["handle"] == handle:
            return msg
    raise LookupError(f"{ifname!r} has no tc object {handle >> 16:x}:{handle & 0xFFFF:x}; not shaped?")

