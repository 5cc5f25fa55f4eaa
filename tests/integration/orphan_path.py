"""A host NIC and a switch port with their port programs, behind which a kernel forwarding path
keeps the sender's socket on each frame, as Open vSwitch's kernel datapath does (for
tests/integration/test_orphan.py and benchmarks/orphan_cost.py):

    host ns                      switch ns
    [host NIC] --veth-- [switch port] -> macvlan -> tc mirred -> [out] -- [sink]

The switch port hands its frames to a macvlan (an rx_handler, as OVS's is), whose tc ingress
redirects them out of `out`; `hold=True` puts a closed TBF there, which keeps them. (A Linux
bridge would not do: it gives the frames up itself, measured.)
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from fabric_emu.kernel import shaping
from fabric_emu.ports import datapath
from fabric_emu.ports.layout import PORT_ORPHAN, PORT_PFC, PORT_SWITCH
from fabric_emu.ports.model import PortEnd
from tests.integration.netns_pair import Pair, recorded_pins, udp_socket, veth_pair

SWITCH_IP, HOST_IP, FAR_IP = "10.97.0.1", "10.97.0.2", "10.97.0.9"
FAR_MAC = "02:aa:00:00:00:09"  # nobody's: every frame goes to `out` anyway
FABRIC_MAC = "02:fe:00:00:01:01"  # a fabric host's, so its lossless frames are marked for hand-off
ROCE_TOS = 26 << 2
SWITCH, HOST = 0, 1


@dataclass
class OrphanPath:
    pair: Pair
    maps: datapath.PortMaps
    out: str

    def ns(self, *cmd: str) -> str:
        return subprocess.run(["ip", "netns", "exec", self.pair.tx_ns, *cmd], check=True, capture_output=True,
                              text=True).stdout

    def set_orphan(self, orphan: bool) -> None:
        """The switch port's flags (with PORT_ORPHAN or not) and limits no test reaches."""
        flags = PORT_SWITCH | PORT_PFC | (PORT_ORPHAN if orphan else 0)
        datapath.configure(self.maps, SWITCH, {"flags": flags, "limit": [1 << 30] * 8,
                                               "xoff": 1 << 29, "xon": (1 << 29) - 20_000, "headroom": 100_000})

    def held_at_out(self) -> int:
        """Packets waiting in `out`'s qdisc."""
        words = self.ns("tc", "-s", "qdisc", "show", "dev", self.out).split()
        return int(words[words.index("backlog") + 2].rstrip("p"))

    def host_socket(self, tos: int = ROCE_TOS) -> socket.socket:
        """A UDP socket of the host's namespace, sending lossless frames unless told otherwise."""
        sock = udp_socket(self.pair.rx_ns)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
        return sock


@contextmanager
def orphan_path(tag: str, hold: bool) -> Iterator[OrphanPath]:
    """The path above, its names all starting with `tag`, removed on exit."""
    with veth_pair(tag, SWITCH_IP, HOST_IP) as pair, recorded_pins(f"{tag}-pins") as pins:
        maps = datapath.PortMaps(pins)
        path = OrphanPath(pair, maps, f"{tag}c")
        try:
            for ns in (pair.tx_ns, pair.rx_ns):  # no IPv6 neighbour discovery into `out`
                subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
                                "net.ipv6.conf.default.disable_ipv6=1"], check=True)
            path.ns("ip", "link", "add", path.out, "type", "veth", "peer", "name", f"{tag}d")
            path.ns("ip", "link", "add", "link", pair.tx_if, "name", f"{tag}m", "type", "macvlan", "mode", "passthru")
            for dev in (f"{tag}m", path.out, f"{tag}d"):
                path.ns("ip", "link", "set", dev, "up")
            path.ns("tc", "qdisc", "add", "dev", f"{tag}m", "clsact")
            path.ns("tc", "filter", "add", "dev", f"{tag}m", "ingress", "u32", "match", "u32", "0", "0",
                    "action", "mirred", "egress", "redirect", "dev", path.out)
            if hold:  # a gate closed for the test's length: 8 bit/s never lets a 1 KB frame out
                path.ns("tc", "qdisc", "replace", "dev", path.out, "root", "tbf", "rate", "8bit", "burst", "1600",
                        "limit", "10000000")
            with shaping.open_iproute(f"/var/run/netns/{pair.rx_ns}") as ipr:
                index = ipr.link_lookup(ifname=pair.rx_if)[0]
                ipr.link("set", index=index, address=FABRIC_MAC)
                ipr.neigh("add", dst=FAR_IP, lladdr=FAR_MAC, ifindex=index, state=0x80)  # NUD_PERMANENT
            ends = [PortEnd(SWITCH, "sw", 1, pair.tx_if, HOST, "switch", 100, 1e9),
                    PortEnd(HOST, "h", 0, pair.rx_if, SWITCH, "host", 100, 1e9)]
            datapath.attach(pins, ends, {"sw": f"/var/run/netns/{pair.tx_ns}",
                                         "h": f"/var/run/netns/{pair.rx_ns}"}, maps)
            yield path
        finally:
            maps.close()
