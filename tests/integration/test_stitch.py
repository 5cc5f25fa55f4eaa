"""A cross-machine link (issue 19) on one kernel, measured with real packets. Two network
namespaces stand for two machines, joined by an underlay veth; each has its own pinned maps
(its own run), a switch port whose veth peer is the link's stitch end, and the link's VXLAN
device (fabric_emu.kernel.vxlan, datapath.attach_stitch):

    m1: swA (switch_egress/ingress) - st1 (stitch_out) ~ x1 (stitch_in) ~ u1 ===
    m2: swB (switch_egress/ingress) - st2 (stitch_out) ~ x2 (stitch_in) ~ u2 ===

Frames are sent on swA as Open vSwitch would have forwarded them (tagged with an ingress port
of m1 that holds their bytes) and captured where they arrive at swB.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import time
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import pytest
from pyroute2 import IPRoute, netns

from fabric_emu.cc.pfc import pfc_frame
from fabric_emu.cc.red import pmax_scaled
from fabric_emu.kernel import bpfsys, vxlan
from fabric_emu.kernel.shaping import open_iproute
from fabric_emu.ports import datapath, queues
from fabric_emu.ports.layout import EV_PFC_RX, PORT_ECN, PORT_PFC, PORT_SWITCH, Event
from fabric_emu.ports.model import PortEnd
from fabric_emu.ports.pfcd import tag_mac
from fabric_emu.spec.machines import VXLAN_OVERHEAD, fits_underlay
from tests.integration.netns_pair import make_veth, recorded_pins, run_in_netns

pytestmark = [pytest.mark.root, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

TAG = f"fest{os.getpid() % 100000}"
MTU = 4200  # the fabric's (IP) MTU: frames of 4214 bytes
FRAME = 14 + MTU
RATE, BUFFER = 10e9, 4 << 20  # fast enough that the class tree never holds the frames back
SWA, INGRESS, SWB = 10, 11, 20  # global port ids: swA and an ingress port of m1's switch, swB
VNI = 7
UNDERLAY = ("10.201.0.1", "10.201.0.2")
ROCE_ECT0_TOS = 26 << 2 | 2
ETH_P_ALL, PACKET_OUTGOING, SO_RCVBUFFORCE, SO_TIMESTAMPNS = 3, 4, 33, 35  # the last two: Python names neither


@dataclass
class Machine:
    ns: str
    port: str  # the switch port
    port_id: int
    maps: datapath.PortMaps

    @property
    def path(self) -> str:
        return f"/var/run/netns/{self.ns}"

    def sender(self, ifname: str) -> socket.socket:
        """An AF_PACKET socket sending whole frames out of ifname."""
        s = run_in_netns(self.ns, lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0))
        s.bind((ifname, 0))
        return s

    def capturer(self, ifname: str) -> socket.socket:
        """An AF_PACKET socket seeing every frame on ifname, with the kernel's arrival time."""
        s = run_in_netns(self.ns, lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL)))
        s.bind((ifname, 0))
        s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 128 << 20)
        s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        return s


def up(ns: str, ifname: str, mtu: int, address: str | None = None) -> None:
    with open_iproute(ns) as ipr:
        index = ipr.link_lookup(ifname=ifname)[0]
        if address:
            ipr.addr("add", index=index, address=address, prefixlen=24)
        ipr.link("set", index=index, mtu=mtu, state="up")


def mac_of(ns: str, ifname: str) -> str:
    with open_iproute(ns) as ipr:
        return ipr.get_links(ipr.link_lookup(ifname=ifname)[0])[0].get_attr("IFLA_ADDRESS")


def switch_port(pins, ns: str, ifname: str, port_id: int) -> datapath.PortMaps:
    """A switch port as a fabric installs it: class tree, map entry, switch programs."""
    path = f"/var/run/netns/{ns}"
    queues.shape_classes(queues.PortQueues(ifname, RATE, MTU, {0: BUFFER, 3: BUFFER, 6: BUFFER}, path))
    maps = datapath.PortMaps(pins)
    datapath.configure(maps, port_id, {"flags": PORT_SWITCH | PORT_ECN | PORT_PFC, "limit": [BUFFER] * 8,
                                       "kmin": 1 << 30, "kmax": 1 << 31, "pmax32": pmax_scaled(0.2),
                                       "xoff": BUFFER // 2, "xon": BUFFER // 2 - 20_000, "headroom": 100_000})
    datapath.attach(pins, [PortEnd(port_id, ns, 1, ifname, 0, "switch", 100, RATE)], {ns: path}, maps)
    return maps


@contextmanager
def machines(underlay_mtu: int, tunnel_mtu: int = MTU) -> Iterator[tuple[Machine, Machine]]:
    """Two machines joined by an underlay of underlay_mtu, with one stitched link between swA
    (m1) and swB (m2) whose tunnels have tunnel_mtu; every namespace removed on exit."""
    m1, m2 = f"{TAG}m1", f"{TAG}m2"
    with ExitStack() as stack:
        for ns in (m1, m2):
            netns.create(ns)
            stack.callback(netns.remove, ns)  # takes every device in it along
        with IPRoute() as ipr:
            make_veth(ipr, f"{TAG}u1", f"{TAG}u2", m1, m2)
            make_veth(ipr, f"{TAG}a", f"{TAG}s1", m1, m1)
            make_veth(ipr, f"{TAG}b", f"{TAG}s2", m2, m2)
        for i, ns in enumerate((m1, m2)):
            up(ns, f"{TAG}u{i + 1}", underlay_mtu, UNDERLAY[i])
        # Neighbours known up front: frames waiting for ARP are dropped past ~48 of them.
        for i, ns in enumerate((m1, m2)):
            with open_iproute(ns) as ipr:
                ipr.neigh("replace", dst=UNDERLAY[1 - i], lladdr=mac_of((m1, m2)[1 - i], f"{TAG}u{2 - i}"),
                          ifindex=ipr.link_lookup(ifname=f"{TAG}u{i + 1}")[0], state=0x80)  # NUD_PERMANENT
        out = []
        for i, (ns, sw, st, port_id) in enumerate(((m1, f"{TAG}a", f"{TAG}s1", SWA), (m2, f"{TAG}b", f"{TAG}s2", SWB))):
            for ifname in (sw, st):
                up(ns, ifname, MTU)
            pins = stack.enter_context(recorded_pins(f"test-fest{i + 1}"))
            maps = switch_port(pins, ns, sw, port_id)
            stack.callback(maps.close)
            if ns == m1:  # the port swA's frames entered m1's switch by; tests charge whole bursts to it
                datapath.configure(maps, INGRESS, {"flags": PORT_SWITCH | PORT_PFC, "limit": [1 << 30] * 8,
                                                   "xoff": 1 << 29, "xon": (1 << 29) - 20_000, "headroom": 100_000})
            vxlan.create(ns, f"{TAG}x{i + 1}", VNI, UNDERLAY[i], UNDERLAY[1 - i], f"{TAG}u{i + 1}", tunnel_mtu)
            datapath.attach_stitch(pins, st, f"{TAG}x{i + 1}", f"/var/run/netns/{ns}")
            out.append(Machine(ns, sw, port_id, maps))
        yield out[0], out[1]


def roce_frame(tos: int = ROCE_ECT0_TOS, size: int = MTU, dport: int = 4791) -> bytes:
    """An IPv4/UDP frame of `size` IP bytes as OVS forwards it out of swA: its source MAC
    carries the ingress port it entered m1's switch by (0e:fe:<in>:00:00)."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    pkt = (Ether(src=f"0e:fe:00:{INGRESS:02x}:00:00", dst="02:00:00:00:00:bb")
           / IP(src="10.0.1.1", dst="10.0.2.1", tos=tos, flags="DF") / UDP(sport=49152, dport=dport))
    return bytes(pkt / (b"r" * (size - 28)))


def capture(sock: socket.socket, quiet_s: float = 0.5) -> list[tuple[float, bytes]]:
    """(kernel arrival time, frame) of every frame arriving on sock until quiet_s of silence."""
    got = []
    while select.select([sock], [], [], quiet_s)[0]:
        data, anc, _, addr = sock.recvmsg(1 << 16, socket.CMSG_SPACE(16))
        if addr[2] == PACKET_OUTGOING:
            continue
        sec, nsec = struct.unpack("=qq", anc[0][2]) if anc else (0, 0)
        got.append((sec + nsec / 1e9, data))
    return got


def roce(frames: Iterable[bytes]) -> list[bytes]:
    """The IPv4/UDP-4791 frames among them (not the namespaces' own IPv6 chatter)."""
    return [f for f in frames if f[12:14] == b"\x08\x00" and f[23] == 17 and f[36:38] == b"\x12\xb7"]


def fragment_field(frame: bytes) -> int:
    """The IPv4 flags and fragment offset of an Ethernet frame."""
    return struct.unpack("!H", frame[20:22])[0]


def ip_checksum_ok(header: bytes) -> bool:
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total == 0xFFFF


def charge(m: Machine, nbytes: int) -> None:
    """What switch_ingress would have charged m1's ingress port for frames of nbytes."""
    m.maps.table.set(INGRESS, "held", m.maps.table.get(INGRESS, "held", 3) + nbytes, 3)


def pair_bytes(m: Machine, in_id: int, out_id: int) -> int | None:
    """The (signed) pair_held entry, None if there is none."""
    for key, value in bpfsys.map_items(m.maps.pairs_fd, 4, 8):
        if struct.unpack("=I", key)[0] == in_id << 16 | out_id:
            return struct.unpack("=q", value)[0]
    return None


@pytest.fixture
def link() -> Iterator[tuple[Machine, Machine]]:
    with machines(underlay_mtu=4250) as pair:
        yield pair


def test_full_frames_cross_whole_untagged_and_are_accounted_on_both_machines(link: tuple[Machine, Machine]) -> None:
    m1, m2 = link
    n = 200
    assert fits_underlay(MTU, vxlan.underlay_mtu(m1.ns, f"{TAG}u1"))
    tx, rx, outer = m1.sender(m1.port), m2.capturer(m2.port), m2.capturer(f"{TAG}u2")
    t1, t2 = m1.maps.table, m2.maps.table
    try:
        charge(m1, n * FRAME)
        held_b = t2.get(SWB, "held", 3)
        for _ in range(n):
            tx.send(roce_frame())
        got = roce(f for _, f in capture(rx))
        wire = [f for _, f in capture(outer, 0.1) if f[12:14] == b"\x08\x00"]
    finally:
        for s in (tx, rx, outer):
            s.close()
    # a. every frame, whole, its tag cleared (02:00 and the rest of the tag kept), but for the
    #    bit that has swB charge it as it is handed over (02:01: a lossless frame with TTL left)
    assert len(got) == n
    assert {len(f) for f in got} == {FRAME}
    assert {f[6:12] for f in got} == {bytes([2, 1, 0, INGRESS, 0, SWA])}
    assert {fragment_field(f) for f in got} == {0x4000}  # DF, no fragment
    assert all(ip_checksum_ok(f[14:34]) for f in got)
    # ... each in one outer packet on the underlay (DF too), no fragment there either
    assert {fragment_field(f) for f in wire} == {0x4000}
    tunnelled = [f for f in wire if roce([f[VXLAN_OVERHEAD:]])]
    assert len(tunnelled) == n and {len(f) for f in tunnelled} == {FRAME + VXLAN_OVERHEAD}
    # b. m1: the frames arrived when they left it; m2: charged at swB, nothing credited
    assert t1.get(SWA, "tx_packets", 3) == n
    assert t1.get(SWA, "queue", 3) == 0
    assert t1.get(INGRESS, "held", 3) == 0
    assert pair_bytes(m1, INGRESS, SWA) == 0
    assert t2.get(SWB, "held", 3) - held_b == n * FRAME
    assert all(t2.get(p, name, 3) == 0 for p in (SWA, INGRESS) for name in ("queue", "held"))
    assert list(bpfsys.map_items(m2.maps.pairs_fd, 4, 8)) == []


def test_ecn_marks_made_before_the_stitch_arrive_on_the_other_machine(link: tuple[Machine, Machine]) -> None:
    m1, m2 = link
    n = 50
    datapath.configure(m1.maps, SWA, {"kmin": 0, "kmax": 1})  # any queue at all: every frame marked
    tx, rx = m1.sender(m1.port), m2.capturer(m2.port)
    try:
        charge(m1, n * FRAME)
        queues.set_gate(m1.port, RATE, MTU, BUFFER, False, m1.path)  # queue them behind a closed gate
        time.sleep(0.05)
        for _ in range(n):
            tx.send(roce_frame())
        marked = m1.maps.table.get(SWA, "marked", 3)
        queues.set_gate(m1.port, RATE, MTU, BUFFER, True, m1.path)
        tx.send(roce_frame(tos=0, size=100, dport=4792))  # an enqueue reschedules the opened gate
        got = roce(f for _, f in capture(rx))
    finally:
        tx.close()
        rx.close()
    # all but those that met an empty queue (depth 0 <= kmin): the first, and maybe the next,
    # when the first was the one frame a gate lets out as it closes (docs/lossless-ports.md)
    assert n - 2 <= marked <= n - 1
    assert len(got) == n
    assert sum(f[15] & 3 == 3 for f in got) == marked
    assert all(ip_checksum_ok(f[14:34]) for f in got)
    assert m1.maps.table.get(SWA, "queue", 3) == 0 and m1.maps.table.get(INGRESS, "held", 3) == 0


def test_a_pfc_frame_crosses_and_the_far_switch_port_reports_its_sender(link: tuple[Machine, Machine]) -> None:
    m1, m2 = link
    ring = bpfsys.RingBuffer(m1.maps.events_fd)
    tx = m2.sender(m2.port)
    try:
        list(ring.records())
        tx.send(pfc_frame(tag_mac(SWB), 1234))
        deadline, events = time.monotonic() + 1.0, []
        while time.monotonic() < deadline and not events:
            events = [e for e in map(Event.unpack, ring.records()) if e.type == EV_PFC_RX]
            time.sleep(0.01)
    finally:
        tx.close()
        ring.close()
    assert [(e.port, e.quanta, e.vector) for e in events] == [(SWB, 1234, 1 << 3)]


def test_an_underlay_short_of_the_fabric_mtu_carries_no_full_frame() -> None:
    """A 1500-byte underlay: the kernel refuses a 4200-byte tunnel over it, and through the
    tunnel it allows (1450) full frames are lost, small ones cross: what the preflight refuses
    (fits_underlay)."""
    with machines(underlay_mtu=1500, tunnel_mtu=1500 - VXLAN_OVERHEAD) as (m1, m2):
        assert not fits_underlay(MTU, vxlan.underlay_mtu(m1.ns, f"{TAG}u1"))
        with pytest.raises(OSError, match="MTU 4200 refused"):
            vxlan.create(m1.ns, f"{TAG}y1", VNI + 1, UNDERLAY[0], UNDERLAY[1], f"{TAG}u1", MTU)
        with open_iproute(m1.ns) as ipr:
            assert ipr.link_lookup(ifname=f"{TAG}y1") == []  # not left half made
        n = 50
        tx, rx = m1.sender(m1.port), m2.capturer(m2.port)
        try:
            charge(m1, n * FRAME)
            for _ in range(n):
                tx.send(roce_frame())
            full = roce(f for _, f in capture(rx))
            charge(m1, n * (14 + 1000))
            for _ in range(n):
                tx.send(roce_frame(size=1000))
            small = roce(f for _, f in capture(rx))
        finally:
            tx.close()
            rx.close()
        print(f"1500-byte underlay: {len(full)} of {n} full frames crossed, {len(small)} of {n} small ones")
        assert len(full) == 0
        assert len(small) == n
        # m1 credited the lost frames too: they had left it (the underlay is not modelled)
        assert m1.maps.table.get(INGRESS, "held", 3) == 0 and m1.maps.table.get(SWA, "queue", 3) == 0


def test_frames_per_second_through_the_stitch(link: tuple[Machine, Machine]) -> None:
    """Not a bound, a figure: full frames from swA's send to swB's receive, one sender."""
    m1, m2 = link
    n = 5000
    frame = roce_frame()
    tx, rx = m1.sender(m1.port), m2.capturer(m2.port)
    try:
        charge(m1, n * FRAME)
        start = time.perf_counter()
        for _ in range(n):
            tx.send(frame)
        sent_s = time.perf_counter() - start
        got = [(t, f) for t, f in capture(rx) if roce([f])]
    finally:
        tx.close()
        rx.close()
    span = got[-1][0] - got[0][0] if len(got) > 1 else float("nan")
    print(f"stitch: {len(got)} of {n} frames of {FRAME} B crossed; sent in {sent_s:.3f} s "
          f"({n / sent_s:,.0f} frames/s), arrivals over {span:.3f} s ({(len(got) - 1) / span:,.0f} frames/s, "
          f"{(len(got) - 1) / span * FRAME * 8 / 1e9:.2f} Gb/s)")
    assert len(got) == n
