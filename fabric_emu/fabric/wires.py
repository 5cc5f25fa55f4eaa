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
with it (a veth pair goes as one), so cleanup needs no records of its own. A fabric split over
machines wires the cut links between two switches of one machine there, by the same commands
over that machine's shell (fabric_emu.fabric.stitch_link.StitchLink), and that machine's agent
cuts them (fabric_emu.run.machine); a link between machines is cut at its stitch end instead.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from typing import TYPE_CHECKING

from fabric_emu.kernel import mininet_compat, rps
from fabric_emu.spec.topology import MAX_IFNAME
from fabric_emu.topo.plan import FabricPlan

if TYPE_CHECKING:
    from fabric_emu.spec.events import EventSpec

mininet_compat.install()  # before any of Mininet: Python 3.12 has no distutils
from mininet.link import Link  # noqa: E402  (after mininet_compat)

WIRE_MTU = 9216  # above any fabric MTU: the wire must never be what drops a frame
IFNAME_RE = re.compile(rf"[A-Za-z0-9_.-]{{1,{MAX_IFNAME}}}")
MAC_RE = re.compile(r"[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}")


def check_ifnames(*names: str) -> None:
    """Refuse a name that is not a usable interface name: it is about to reach a shell."""
    for name in names:
        if not IFNAME_RE.fullmatch(name):
            raise ValueError(f"{name!r} is not a usable interface name")


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


def wire_commands(port1: str, port2: str, addr1: str | None = None, addr2: str | None = None) -> list[str]:
    """The shell commands that join switch ports port1 and port2 (the root namespace of the
    machine they run on) by a wire: two veth pairs whose middle ends tc redirects into each
    other, both ways. Not the wire ends' receive steering, which needs that machine's CPUs
    (steer_wires). Names and addresses are checked first: they reach a shell."""
    check_ifnames(port1, port2)
    for addr in (addr1, addr2):
        if addr is not None and not MAC_RE.fullmatch(addr):
            raise ValueError(f"{addr!r} is not a MAC address")
    wire1, wire2 = wire_name(port1), wire_name(port2)
    cmds = []
    for port, wire, addr in ((port1, wire1, addr1), (port2, wire2, addr2)):
        cmds += [f"ip link add name {port}{f' address {addr}' if addr else ''} type veth peer name {wire}"
                 f" mtu {WIRE_MTU}",
                 f"echo 1 > /proc/sys/net/ipv6/conf/{wire}/disable_ipv6",
                 f"tc qdisc add dev {wire} clsact"]
    for wire, other in ((wire1, wire2), (wire2, wire1)):
        cmds.append(f"tc filter add dev {wire} ingress protocol all u32 match u32 0 0"  # no matchall on every kernel
                    f" action mirred egress redirect dev {other}")
    return cmds + [f"ip link set {wire} up" for wire in (wire1, wire2)]


def as_one_shell(cmds: list[str]) -> str:
    """Commands as one `sh -c` script that stops at the first to fail."""
    return "set -e; " + "; ".join(cmds)


def steer_wires(ports: list[str], mask: str) -> None:
    """One more receive backlog per wire end: steered like every link end (`mask`, usually
    rps.all_cpus_mask()), to keep each flow on one CPU (kernel/rps.py)."""
    for port in ports:
        rps.steer(wire_name(port), mask)


def make_wired_pair(port1: str, port2: str, addr1: str | None = None, addr2: str | None = None) -> None:
    """Switch ports port1 and port2 of this machine, joined by a wire (wire_commands)."""
    subprocess.run(["sh", "-c", as_one_shell(wire_commands(port1, port2, addr1, addr2))],
                   check=True, capture_output=True, text=True, timeout=60)
    steer_wires([port1, port2], rps.all_cpus_mask())


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
