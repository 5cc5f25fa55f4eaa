"""A Cluster Edition link between machines that keeps the port model (issue 19): each end of a
cut link is a veth on its own machine (the switch port, with all its port machinery) whose
other end, the stitch end, is joined to one kernel VXLAN device of that link (its own VNI,
unicast to the other machine's underlay address, no learning, never fragmented). The port
programs do the joining (port.c's stitch_out / stitch_in, attached by fabric_emu.run.machine);
without them, a tc redirect does. No Linux bridge is in the path: it would drop PFC frames."""

from __future__ import annotations

import ipaddress
import re
import shlex
from collections.abc import Callable

from fabric_emu.fabric.machines import Machine
from fabric_emu.fabric.wires import as_one_shell, check_ifnames, wire_commands
from fabric_emu.kernel import mininet_compat
from fabric_emu.kernel.vxlan import VXLAN_PORT
from fabric_emu.topo.placement import Placement
from fabric_emu.topo.plan import FabricPlan

mininet_compat.install()  # before any of Mininet: Python 3.12 has no distutils
from mininet.examples import cluster as ce  # noqa: E402  (after mininet_compat)

UNDERLAY_DEVICE_RE = re.compile(r"\bdev (\S+)")


def stitch_names(vni: int) -> tuple[str, str]:
    """A cut link's two devices on each machine: the stitch end of its veth and its VXLAN device."""
    return f"fest{vni}", f"fevx{vni}"


def stitch_commands(intf: str, vni: int, local: str, remote: str, underlay_dev: str, mtu: int,
                    redirect: bool = True) -> list[str]:
    """The commands that make one machine's end of a cut link: the switch port `intf` as one
    end of a veth whose other end (the stitch end) is redirected, both ways, to and from the
    link's VXLAN device. Unicast to the one remote, no learning, never fragmented (df set: a
    frame the underlay cannot carry whole must be lost, not passed in pieces). redirect=False:
    no tc redirect, for the port programs' stitch (fabric_emu.run.machine attaches it)."""
    stitch, vx = stitch_names(vni)
    check_ifnames(intf, stitch, vx, underlay_dev)
    for address in (local, remote):
        ipaddress.ip_address(address)
    return [
        f"ip link add name {intf} mtu {mtu} type veth peer name {stitch} mtu {mtu}",
        f"ip link add {vx} type vxlan id {vni} local {local} remote {remote} dstport {VXLAN_PORT}"
        f" dev {underlay_dev} nolearning df set",
        f"ip link set {vx} mtu {mtu} up",
        f"ip link set {stitch} up",
    ] + ([] if not redirect else [
        f"tc qdisc add dev {stitch} clsact",
        f"tc filter add dev {stitch} ingress protocol all u32 match u32 0 0 action mirred egress redirect dev {vx}",
        f"tc qdisc add dev {vx} clsact",
        f"tc filter add dev {vx} ingress protocol all u32 match u32 0 0 action mirred egress redirect dev {stitch}",
    ])


class _Tunnel:
    """What Cluster Edition keeps of a link between machines (RemoteLink.tunnel): terminate()
    removes the VXLAN devices; RemoteLink.stop then deletes the two ports, and so the veths."""

    def __init__(self, ends: list[tuple[ce.RemoteMixin, str]]) -> None:
        self.ends = ends

    def terminate(self) -> None:
        for node, device in self.ends:
            node.rcmd(f"ip link del {device} 2>/dev/null")

    def poll(self) -> None:
        return None


class StitchLink(ce.RemoteLink):
    """A Cluster Edition link that, between machines, is a VXLAN-stitched veth on each side
    (see the module's doc). Bound to a run by `stitch_link_for` (VNIs, underlay addresses)."""

    vnis: dict[frozenset[str], int] = {}
    machines: dict[str, Machine] = {}
    mtu: int = 1500
    redirect: bool = True  # False: the machines' port programs stitch (fabric_emu.run.machine)
    devices: dict[tuple[str, str], str] = {}  # (machine, remote underlay address) -> device
    wired: frozenset[frozenset[str]] = frozenset()  # switch pairs on one machine whose link the run cuts

    def makeIntfPair(self, intfname1, intfname2, addr1=None, addr2=None, node1=None, node2=None,
                     deleteIntfs=True):  # noqa: N802 (Mininet's name)
        """A link the run cuts between two switches of one machine gets a wire in the middle,
        made there (fabric_emu.fabric.wires); every other link as Cluster Edition makes it."""
        node1 = self.node1 if node1 is None else node1
        node2 = self.node2 if node2 is None else node2
        if node1.server != node2.server or frozenset((node1.name, node2.name)) not in self.wired:
            return super().makeIntfPair(intfname1, intfname2, addr1, addr2, node1, node2, deleteIntfs)
        cmds = wire_commands(intfname1, intfname2, addr1, addr2)
        out = node1.rcmd(["sh", "-c", shlex.quote(as_one_shell(cmds))]).strip()
        if out:
            raise RuntimeError(f"{node1.server}: making the wired link {intfname1}-{intfname2} failed: "
                               f"{out.splitlines()[-1]}")
        return None

    def makeTunnel(self, node1, node2, intfname1, intfname2, addr1=None, addr2=None):  # noqa: N802
        vni = self.vnis[frozenset((intfname1, intfname2))]
        vx = stitch_names(vni)[1]
        made: list[tuple[ce.RemoteMixin, str]] = []  # (node, device): the port takes its veth peer along
        for node, intf, addr, peer in ((node1, intfname1, addr1, node2), (node2, intfname2, addr2, node1)):
            local, remote = self.machines[node.server].underlay, self.machines[peer.server].underlay
            key = (node.server, remote)
            if key not in self.devices:  # one lookup per machine and peer: every link leaves the same way
                self.devices[key] = underlay_device(node.rcmd, remote)
            made += [(node, intf), (node, vx)]
            cmds = stitch_commands(intf, vni, local, remote, self.devices[key], self.mtu, self.redirect)
            if addr:
                cmds.append(f"ip link set {intf} address {addr}")
            # one ssh for the whole end: each command is silent when it works, and the first
            # that fails stops the rest (a new ssh per command made most of a fabric's start-up)
            out = node.rcmd(["sh", "-c", shlex.quote(as_one_shell(cmds))]).strip()
            if out:
                _Tunnel(made).terminate()
                raise RuntimeError(f"{node.server}: making {intf}'s end of the link failed: {out.splitlines()[-1]}")
        ends = [(node, name) for node, name in made if name == vx]
        return _Tunnel(ends)


def underlay_device(rcmd: Callable[[str], str], remote: str) -> str:
    """The device a machine reaches `remote` by (its route), run on that machine."""
    match = UNDERLAY_DEVICE_RE.search(rcmd(f"ip route get {remote}"))
    if not match:
        raise RuntimeError(f"no route to the underlay address {remote}")
    return match.group(1)


def cut_vnis(plan: FabricPlan, placement: Placement) -> dict[frozenset[str], int]:
    """A VNI per cut link (its index in the plan, from 1), by its two interfaces."""
    return {frozenset((ln.a_intf, ln.b_intf)): i for i, ln in enumerate(plan.links, start=1) if ln in placement.cut}


def stitch_link_for(plan: FabricPlan, placement: Placement, machines: list[Machine],
                    redirect: bool = True, wired: frozenset[frozenset[str]] = frozenset()) -> type[StitchLink]:
    """StitchLink bound to one fabric; `wired`: the switch pairs whose link the run cuts (only
    those on one machine get a wire: the others are cut at their stitch ends)."""
    return type("FabricStitchLink", (StitchLink,), {"vnis": cut_vnis(plan, placement), "mtu": plan.mtu,
                                                    "machines": {m.name: m for m in machines},
                                                    "redirect": redirect, "devices": {}, "wired": wired})
