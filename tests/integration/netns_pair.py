"""A veth pair between two throwaway network namespaces, for tests of the kernel side of
ports (no Mininet, no OVS). Names are unique per test process; addresses stay inside them."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pyroute2 import IPRoute, netns

from fabric_emu.kernel import shaping
from fabric_emu.ports import datapath
from fabric_emu.state.cleanup import clean_record
from fabric_emu.state.records import RunRecord

T = TypeVar("T")


@dataclass(frozen=True)
class Pair:
    """A veth pair: tx_if in namespace tx_ns, rx_if in rx_ns."""

    tx_ns: str
    rx_ns: str
    tx_if: str
    rx_if: str


def run_in_netns(ns: str, fn: Callable[[], T]) -> T:
    """Run fn in a throwaway thread switched into ns (setns affects only that thread)."""
    out: list[T] = []

    def target() -> None:
        netns.setns(ns, flags=0, fork=False)
        out.append(fn())

    worker = threading.Thread(target=target)
    worker.start()
    worker.join()
    return out[0]


def udp_socket(ns: str) -> socket.socket:
    """A UDP socket living in namespace ns."""
    return run_in_netns(ns, lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))


def make_veth(ipr: IPRoute, tx_if: str, rx_if: str, tx_ns: str, rx_ns: str) -> None:
    """Create a veth pair in ipr's namespace and move each end into its namespace."""
    ipr.link("add", ifname=tx_if, kind="veth", peer={"ifname": rx_if, "net_ns_fd": rx_ns})
    ipr.link("set", index=ipr.link_lookup(ifname=tx_if)[0], net_ns_fd=tx_ns)


def bring_up(ns: str, ifname: str, address: str | None = None) -> None:
    """Set ifname in ns up, optionally with an address in 10.98.0.0/24."""
    with shaping.open_iproute(ns) as ipr:
        index = ipr.link_lookup(ifname=ifname)[0]
        if address:
            ipr.addr("add", index=index, address=address, prefixlen=24)
        ipr.link("set", index=index, state="up")


@contextmanager
def veth_pair(tag: str, tx_ip: str, rx_ip: str) -> Iterator[Pair]:
    """Namespaces <tag>tx and <tag>rx joined by veth <tag>a (tx side) and <tag>b, up, with
    the two /24 addresses; both namespaces (and so the pair) are removed on exit."""
    p = Pair(f"{tag}tx", f"{tag}rx", f"{tag}a", f"{tag}b")
    netns.create(p.tx_ns)
    try:
        netns.create(p.rx_ns)
        with IPRoute() as ipr:
            make_veth(ipr, p.tx_if, p.rx_if, p.tx_ns, p.rx_ns)
        bring_up(p.tx_ns, p.tx_if, tx_ip)
        bring_up(p.rx_ns, p.rx_if, rx_ip)
        yield p
    finally:
        for ns in (p.tx_ns, p.rx_ns):
            if ns in netns.listnetns():
                netns.remove(ns)  # takes the veth pair with it


@contextmanager
def recorded_pins(prefix: str) -> Iterator[Path]:
    """The port programs loaded and their maps pinned under run id <prefix><pid>, with a run
    record naming the pin folder saved first, as a run does: a test or benchmark killed midway
    leaves only what `fabric-emu clean` (and the suite's start, tests/conftest.py) removes."""
    rec = RunRecord.new(f"{prefix}{os.getpid()}")
    rec.paths.append(str(datapath.pin_dir(rec.run_id)))
    rec.save()
    try:
        yield datapath.load(rec.run_id)
    finally:
        clean_record(rec)
