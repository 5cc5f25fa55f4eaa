"""The emulated fabric: Mininet hosts and Open vSwitch switches built from a FabricPlan.

This is kernel/process plumbing only; every decision (names, ports, addresses, rates) comes from
the plan. Switches use the OVS datapath the plan's extra["datapath"] names (fabric_emu.kernel.
ovs_datapath: the kernel's where openvswitch.ko loads, else the userspace one, as on our CI
kernel, which has no OVS module; a plan without one: userspace); each link end
gets its traffic classes (HTB at the emulated rate, a queue per class) through
fabric_emu.ports.queues, with limits from the port plan; host NICs also get the per-queue-pair
HTB their agents put rate classes in (fabric_emu.ports.qp_limiter).
"""

from __future__ import annotations

import re
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

from fabric_emu.kernel import mininet_compat

mininet_compat.install()  # before any of Mininet: Python 3.12 has no distutils
from mininet.net import Mininet
from mininet.node import Host, OVSSwitch, RemoteController
from mininet.topo import Topo
from pyroute2 import IPRoute

from fabric_emu.fabric import wires
from fabric_emu.kernel import ovs_datapath, rps, rtnl
from fabric_emu.kernel.rtnl import Batch
from fabric_emu.topo.plan import FabricPlan
from fabric_emu.ports import queues
from fabric_emu.ports.model import PortPlan
from fabric_emu.wire.roce import ROCE_UDP_PORT
from fabric_emu.state.records import OVS_OWNER_KEY, RunRecord


class PlanTopo(Topo):
    """A Mininet Topo that mirrors the plan exactly (names, MACs, IPs, port numbers)."""

    def build(self, plan: FabricPlan, wired: frozenset[frozenset[str]] = frozenset()) -> None:  # type: ignore[override]
        for sw in plan.switches:
            self.addSwitch(sw.name, dpid=f"{sw.dpid:016x}")
        prefix = plan.subnet.split("/")[1]
        for h in plan.hosts:
            self.addHost(h.name, ip=f"{h.ip}/{prefix}", mac=h.mac)
        for ln in plan.links:
            cls = wires.WiredLink if frozenset((ln.a, ln.b)) in wired else None
            self.addLink(ln.a, ln.b, port1=ln.a_port, port2=ln.b_port, **({"cls": cls} if cls else {}))


class FabricSwitch(OVSSwitch):
    """OVS bridge (on the userspace datapath unless datapath="kernel"), tagged with the run id in
    the same transaction that creates it, so cleanup can always tell our bridges from anyone else's."""

    def __init__(self, name: str, run_id: str = "", **params) -> None:
        params.setdefault("datapath", "user")
        params.setdefault("failMode", "secure")
        params.setdefault("protocols", "OpenFlow15")
        super().__init__(name, **params)
        self.run_id = run_id

    def bridgeOpts(self) -> str:
        # Mininet names only netdev; say system outright rather than rely on OVS's default.
        kernel = " datapath_type=system" if self.datapath == "kernel" else ""
        return super().bridgeOpts() + kernel + f" external_ids:{OVS_OWNER_KEY}={self.run_id}"


class LaunchedController(RemoteController):
    """Our os-ken process: the launcher waits for it to listen before any switch starts, so
    Mininet's probe at construction time (while it is still booting) would only warn wrongly."""

    def checkListening(self) -> None:
        return None


def existing_bridges() -> set[str]:
    out = subprocess.run(["ovs-vsctl", "--timeout=10", "list-br"], check=True,
                         capture_output=True, text=True).stdout
    return set(out.split())


def root_link_names() -> set[str]:
    with IPRoute() as ipr:
        return {link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}


def switch_interfaces(plan: FabricPlan) -> list[str]:
    """The link ends that live in the root namespace (every switch port)."""
    switches = set(plan.switch_by_name)
    names = []
    for ln in plan.links:
        if ln.a in switches:
            names.append(ln.a_intf)
        if ln.b in switches:
            names.append(ln.b_intf)
    return names


def prepare_switch_port(ifname: str, cpu_mask: str) -> None:
    """A switch port in the root namespace: no IPv6 chatter, and receive packet steering
    (fabric_emu.kernel.rps: a flow must not be reordered by the emulator)."""
    Path(f"/proc/sys/net/ipv6/conf/{ifname}/disable_ipv6").write_text("1")
    rps.steer(ifname, cpu_mask)


def prepare_host_interface_command(intf: str, mtu: int, cpu_mask: str) -> str:
    """The shell command, run in a host's network namespace, that prepares its interface: no
    IPv6 chatter, the fabric's MTU, no TX checksum offload (the userspace datapath forwards
    partially checksummed packets unfixed) and receive packet steering (fabric_emu.kernel.rps:
    a flow must not be reordered by the emulator). Silent when it works. /proc/sys/net shows
    the namespace of whoever opens it: the shell's own."""
    return ("for c in all default; do echo 1 > /proc/sys/net/ipv6/conf/$c/disable_ipv6; done;"
            f" ip link set dev {intf} mtu {mtu}; ethtool -K {intf} tx off >/dev/null;"
            f" {rps.host_shell_command(intf, cpu_mask)}")


def shape_ports(ports: PortPlan, mtu: int, netns_of: Callable[[str], str | None]) -> None:
    """Every link end's traffic classes at its emulated rate; host NICs also get the
    per-queue-pair classes their agents put rate classes in."""
    queues.shape_all(queues.PortQueues(end.intf, end.emulated_bps, mtu, ports.settings(end).fifo_limits,
                                       netns_of(end.node), qp_classes=end.role != "switch") for end in ports.ends)


def conflicts(plan: FabricPlan) -> list[str]:
    """Names the fabric needs that something else on this machine already uses."""
    taken = existing_bridges() & set(plan.switch_by_name)
    taken |= root_link_names() & (set(switch_interfaces(plan)) | set(plan.switch_by_name))
    return sorted(taken)


class Fabric:
    """Build, start and stop the Mininet network for one run."""

    def __init__(self, plan: FabricPlan, record: RunRecord, controller_port: int,
                 ports: PortPlan, wired: frozenset[frozenset[str]] = frozenset()) -> None:
        self.plan = plan
        self.wired = wired  # switch pairs whose link has a wire in the middle (fabric_emu.fabric.wires)
        self.ports = ports
        self.record = record
        self.controller_port = controller_port
        self.datapath = ovs_datapath.datapath_of(plan.extra)  # "kernel" or "userspace"
        self.net: Mininet | None = None

    def host(self, name: str) -> Host:
        assert self.net is not None
        return self.net.get(name)

    def netns_of(self, node: str) -> str | None:
        """Namespace path of a node's interfaces (None: the root namespace)."""
        if node in self.plan.host_by_name:
            return f"/proc/{self.host(node).pid}/ns/net"
        return None

    def build(self) -> None:
        """Create hosts, bridges' objects and links (no switch runs yet)."""
        plan = self.plan
        # Record the link names before creating them: a kill -9 from here on is still
        # cleanable. Bridges need no entry: each carries the run id in OVS itself.
        self.record.interfaces = switch_interfaces(plan)
        self.record.save()
        ovs_datapath.prepare(self.datapath)  # the kernel datapath before its first bridge; tun
        mininet_dp = ovs_datapath.MININET_DATAPATH[self.datapath]

        def make_switch(name: str, **params) -> FabricSwitch:
            return FabricSwitch(name, run_id=self.record.run_id, datapath=mininet_dp, **params)

        self.net = Mininet(topo=PlanTopo(plan=plan, wired=self.wired), switch=make_switch, controller=None,
                           autoSetMacs=False, autoStaticArp=False, build=False,
                           waitConnected=False)
        self.net.addController(LaunchedController("c0", ip="127.0.0.1", port=self.controller_port))
        self.net.build()
        self.record.add_processes([(h.pid, f"host-shell {h.name}") for h in self.net.hosts])
        self._prepare_interfaces()

    def start(self) -> None:
        """Create and connect the OVS bridges, then give every link end its egress queue."""
        assert self.net is not None, "build() first"
        self.net.start()
        self._reconnect_fast()
        if self.datapath == "kernel":  # else the run would only fail later, as "no connectivity"
            off = ovs_datapath.bridges_off_the_kernel_datapath([sw.name for sw in self.plan.switches])
            if off:
                raise RuntimeError(f"Open vSwitch did not put {', '.join(off[:4])} on its kernel datapath "
                                   "(see ovs-appctl dpif/show and ovs-vswitchd.log; if it started before the "
                                   "openvswitch module was loaded, restart it: scripts/setup.sh)")
        self._shape_links()

    def _reconnect_fast(self) -> None:
        """A switch that lost its controller retries with a doubling backoff, up to 8 s by
        default: capped at 1 s (Open vSwitch's least), a restarted controller gets every switch
        back about a second after it listens. (fail_mode secure keeps the flows meanwhile.)"""
        target = f'"tcp:127.0.0.1:{self.controller_port}"'
        uuids = subprocess.run(["ovs-vsctl", "--bare", "--columns=_uuid", "find", "Controller", f"target={target}"],
                               capture_output=True, text=True, timeout=30, check=True).stdout.split()
        cmd = ["ovs-vsctl"]
        for uuid in uuids:
            cmd += ["--", "set", "Controller", uuid, "max_backoff=1000"]
        if uuids:
            subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True)

    def _prepare_interfaces(self) -> None:
        """MTU on every link end, no IPv6 chatter, and receive packet steering everywhere
        (prepare_switch_port, prepare_host_interface_command)."""
        mask = rps.all_cpus_mask()
        sock = rtnl.netlink_socket()
        try:
            mtu = Batch()
            for ifname in switch_interfaces(self.plan):
                prepare_switch_port(ifname, mask)
                mtu.add(rtnl.RTM_NEWLINK, rtnl.CHANGE, rtnl.mtu_change(socket.if_nametoindex(ifname), self.plan.mtu),
                        f"{ifname}: MTU {self.plan.mtu} not set")
            mtu.send(sock)
        finally:
            sock.close()
        for h in self.net.hosts:  # all hosts at once: each shell runs its own command
            h.sendCmd(prepare_host_interface_command(self.plan.host_by_name[h.name].intf, self.plan.mtu, mask))
        for h in self.net.hosts:  # each command is silent when it works
            out = h.waitOutput().strip()
            if out:
                raise RuntimeError(f"preparing {h.name}'s interface failed: {out.splitlines()[0]}")

    def _shape_links(self) -> None:
        shape_ports(self.ports, self.plan.mtu, self.netns_of)

    def netns_by_node(self) -> dict[str, str | None]:
        return {end.node: self.netns_of(end.node) for end in self.ports.ends}

    def stop(self) -> None:
        if self.net is not None:
            self.net.stop()
            self.net = None

    def check_reachable(self, ranks: list[str], attempts: int = 3) -> None:
        """Every rank pings its ring neighbour (all at once); this also fills the ARP caches."""
        assert self.net is not None
        pending = [(a, ranks[(i + 1) % len(ranks)]) for i, a in enumerate(ranks)]
        for _ in range(attempts):
            procs = [(a, b, self.host(a).popen(
                ["ping", "-c1", "-W2", "-q", self.plan.host_by_name[b].ip],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)) for a, b in pending]
            pending = [(a, b) for a, b, p in procs if p.wait() != 0]
            if not pending:
                return
        hint = ovs_datapath.lost_upcalls_hint() if self.datapath == "kernel" else ""
        raise RuntimeError("no connectivity: " + ", ".join(f"{a} -> {b}" for a, b in pending) + hint)

    def uplink_of(self, src: str, dst: str, udp_src: int) -> str:
        """The spine the source leaf's OpenFlow tables send this RoCE flow to ('' when both
        hosts share a leaf), as decided by OVS itself (ofproto/trace of the installed rules)."""
        s, d = self.plan.host_by_name[src], self.plan.host_by_name[dst]
        if s.leaf == d.leaf:
            return ""
        # TTL 64: the NICs' (Linux's default); a trace with none would die at TTL 0 in table 0.
        flow = (f"udp,in_port={s.leaf_port},dl_src={s.mac},dl_dst={d.mac},nw_src={s.ip},"
                f"nw_dst={d.ip},nw_ttl=64,udp_src={udp_src},udp_dst={ROCE_UDP_PORT}")
        trace = subprocess.run(["ovs-appctl", "ofproto/trace", s.leaf, flow],
                               capture_output=True, text=True, timeout=10, check=True).stdout
        ports = re.findall(r"\boutput:(\d+)", trace.split("Final flow:")[0])
        by_port = {p.port: p.peer for p in self.plan.ports(s.leaf)}
        if not ports or int(ports[-1]) not in by_port:
            raise RuntimeError(f"cannot tell the uplink of {src}->{dst} udp_src {udp_src}:\n{trace}")
        return by_port[int(ports[-1])]

    def set_link(self, a: str, b: str, up: bool) -> None:
        """Take the link between switches a and b down (its wire, when it has one: the ports
        lose their carrier; else both ends, taken down), or bring it back. Open vSwitch tells the
        controller (port status), which reroutes."""
        ends = [p.intf for p in self.plan.link_ends(a, b)]
        if frozenset((a, b)) in self.wired:
            wires.set_wire(ends, up)
            return
        with IPRoute() as ipr:
            for name in ends:
                ipr.link("set", index=ipr.link_lookup(ifname=name)[0], state="up" if up else "down")

    def set_link_rate(self, a: str, b: str, gbps: float) -> None:
        """Change the modelled rate of the link between switches a and b, both ends, in place."""
        ends = [p.intf for p in self.plan.link_ends(a, b)]
        for name in ends:
            queues.set_link_rate(name, gbps * 1e9 / self.plan.dilation, self.plan.mtu)

    def annotate_uplinks(self, agents: dict[str, dict]) -> None:
        """Add the chosen uplink to every sender QP in the agents' stats."""
        for src, stats in agents.items():
            for qp in stats.get("send_qps", []):
                qp["uplink"] = self.uplink_of(src, qp["dst"], qp["udp_src"])
