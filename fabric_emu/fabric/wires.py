"""Links a run cuts: each switch port a veth of its own, joined in the middle by a wire.

A link between two switches is one veth pair, so the only way to cut it is to take its ends
down. Open vSwitch then still sends the dead link's frames (until the controller reroutes, and
for good while the controller is away), and the kernel refuses them before any port program sees
them: a lossless frame stays charged to the port it came in by, and once enough have, that port
pauses its upstream for ever (docs/controller-restart.md measured it: a run stalled to its
deadline). A cut cable takes the carrier away and leaves the port up. So a link that the run's
events cut is built as two veth pairs, `port a - wire a` and `wire b - port b`, the wire ends
redirected into each other by tc; the cut takes the wire ends down. The switch ports stay up,
lose their carrier (Open vSwitch reports the link down, the controller reroutes, fast-failover
groups detour), and the frames Open vSwitch still sends them reach their egress programs, which
drop them and give their bytes back (bpf/port.c, `link_cut`).

The wire costs each frame on that link one more veth crossing, so only the links a run's events
cut get one (benchmarks/wire_cost.py measures it), and in a lab, whose user may cut any, every
link between two switches. Deleting a switch port deletes its wire end
with it (a veth pair goes as one), so cleanup needs no records of its own.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from fabric_emu.kernel import mininet_compat, rps
from fabric_emu.topo.plan import FabricPlan

if TYPE_CHECKING:
    from fabric_emu.spec.events import EventSpec

mininet_compat.install()  # before any of Mininet: Python 3.12 has no distutils
from mininet.link import Link  # noqa: E402  (after mininet_compat)

WIRE_MTU = 9216  # above any fabric MTU: the wire must never be what drops a frame


def wire_name(intf: str) -> str:
    """The wire end joined to switch port `intf` (a name of its own, at most 15 characters)."""
    return "few" + hashlib.sha1(intf.encode()).hexdigest()[:10]


def cut_links(events: list[EventSpec]) -> frozenset[frozenset[str]]:
    """The switch pairs whose link a run's events take down (`link: a-b`, `state: down`)."""
    return frozenset(frozenset(e.link.split("-")) for e in events if e.link is not None and e.state == "down")


def switch_links(plan: FabricPlan) -> frozenset[frozenset[str]]:
    """Every link between two switches (a lab's user may cut any)."""
    return frozenset(frozenset((ln.a, ln.b)) for ln in plan.links if ln.kind == "fabric")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def _tc(*args: str) -> None:
    subprocess.run(["tc", *args], check=True, capture_output=True, text=True, timeout=30)


def make_wired_pair(port1: str, port2: str, addr1: str | None = None, addr2: str | None = None) -> None:
    """Switch ports port1 and port2 (root namespace), joined by a wire: two veth pairs whose
    middle ends tc redirects into each other, both ways."""
    wire1, wire2 = wire_name(port1), wire_name(port2)
    for port, wire, addr in ((port1, wire1, addr1), (port2, wire2, addr2)):
        _ip("link", "add", "name", port, *(["address", addr] if addr else []), "type", "veth",
            "peer", "name", wire, "mtu", str(WIRE_MTU))
        Path(f"/proc/sys/net/ipv6/conf/{wire}/disable_ipv6").write_text("1")
        rps.steer(wire, rps.all_cpus_mask())  # one more receive backlog: keep each flow on one CPU
        _tc("qdisc", "add", "dev", wire, "clsact")
    for wire, other in ((wire1, wire2), (wire2, wire1)):
        _tc("filter", "add", "dev", wire, "ingress", "protocol", "all", "u32", "match", "u32", "0", "0",
            "action", "mirred", "egress", "redirect", "dev", other)  # no matchall on every kernel
    set_wire([port1, port2], up=True)


class WiredLink(Link):
    """A Mininet link between two switches (both in the root namespace) with a wire in the middle."""

    @classmethod
    def makeIntfPair(cls, intfname1, intfname2, addr1=None, addr2=None, node1=None, node2=None,
                     deleteIntfs=True):  # noqa: N802 (Mininet's name)
        make_wired_pair(intfname1, intfname2, addr1, addr2)


def set_wire(ports: list[str], up: bool) -> None:
    """Take the wire ends of these switch ports down (a cut cable: the ports stay up, without
    carrier) or back up."""
    for port in ports:
        _ip("link", "set", wire_name(port), "up" if up else "down")
