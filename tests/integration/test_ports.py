"""The kernel side of a switch port, measured with real packets: a veth pair between two
namespaces, the class tree and the BPF programs on it exactly as a fabric installs them.

The "switch" end (tx) holds its RoCE class with the PFC gate closed, so the queue depth is
whatever we put in it: the ECN profile is measured at chosen depths, and the programs' byte
accounting is compared with the qdisc's own backlog.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from fabric_emu.cc.red import mark_probability, pmax_scaled
from fabric_emu.ports import datapath, queues
from fabric_emu.ports.layout import PORT_ECN, PORT_PFC, PORT_SWITCH
from fabric_emu.ports.model import PortEnd
from tests.integration.netns_pair import Pair, recorded_pins, run_in_netns, udp_socket, veth_pair

pytestmark = [pytest.mark.root, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

TAG = f"fept{os.getpid() % 100000}"
TX_IP, RX_IP = "10.97.0.1", "10.97.0.2"
RATE, MTU, BUFFER = 20e6, 1500, 2_000_000
KMIN, KMAX, PMAX = 50_000, 150_000, 0.5
ROCE_TOS, ROCE_ECT0_TOS = 26 << 2, 26 << 2 | 2
PORT = 4791
FRAME_OVERHEAD = 14 + 20 + 8  # Ethernet + IPv4 + UDP, as the qdiscs count bytes
PROBE = b"p"  # 43-byte frames: 1000 probes move the depth by 43 KB


@dataclass
class Port:
    pair: Pair
    maps: datapath.PortMaps
    tx: socket.socket
    rx: socket.socket

    @property
    def tx_ns_path(self) -> str:
        return f"/var/run/netns/{self.pair.tx_ns}"

    def set_flags(self, flags: int) -> None:
        datapath.configure(self.maps, 0, {"flags": flags, "limit": [BUFFER] * 8, "kmin": KMIN,
                                          "kmax": KMAX, "pmax32": pmax_scaled(PMAX)})

    def gate(self, is_open: bool) -> None:
        queues.set_gate(self.pair.tx_if, RATE, MTU, BUFFER, is_open, self.tx_ns_path)
        if is_open:  # a closed TBF is not rescheduled by the change: enqueue something
            self.tx.sendto(b"kick", (RX_IP, PORT + 1))

    def send(self, payload: bytes, tos: int, count: int) -> None:
        self.tx.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
        for _ in range(count):
            self.tx.sendto(payload, (RX_IP, PORT))

    def roce_backlog(self) -> tuple[int, int]:
        """(the programs' accounting, the qdisc's backlog) of the RoCE class, in bytes."""
        kernel = queues.class_stats(self.pair.tx_if, self.tx_ns_path)[queues.LOSSLESS]
        return self.maps.table.get(0, "queue", queues.LOSSLESS), kernel.backlog_bytes

    def receive_all(self) -> list[tuple[int, bool]]:
        """(payload length, CE) of every RoCE-port packet until 0.5 s of silence."""
        got = []
        try:
            while True:
                data, anc, _, _ = self.rx.recvmsg(4096, socket.CMSG_SPACE(1))
                got.append((len(data), bool(anc) and anc[0][2][0] & 3 == 3))
        except TimeoutError:
            return got


@pytest.fixture
def port() -> Iterator[Port]:
    with veth_pair(TAG, TX_IP, RX_IP) as pair, recorded_pins("test-fept") as pins:
        tx_ns = f"/var/run/netns/{pair.tx_ns}"
        limits = {0: BUFFER, 3: BUFFER, 6: BUFFER}
        queues.shape_classes(queues.PortQueues(pair.tx_if, RATE, MTU, limits, tx_ns))
        maps = datapath.PortMaps(pins)
        ends = [PortEnd(0, "sw", 1, pair.tx_if, 1, "switch", 100, RATE),
                PortEnd(1, "h", 0, pair.rx_if, 0, "host", 100, RATE)]
        rx = udp_socket(pair.rx_ns)
        tx = udp_socket(pair.tx_ns)
        try:
            datapath.attach(pins, ends, {"sw": tx_ns, "h": f"/var/run/netns/{pair.rx_ns}"}, maps)
            rx.bind((RX_IP, PORT))
            rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
            rx.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
            rx.settimeout(0.5)
            p = Port(pair, maps, tx, rx)
            p.set_flags(PORT_SWITCH | PORT_ECN)
            p.send(b"arp", ROCE_TOS, 1)  # resolve the neighbour before the gate closes
            p.receive_all()
            yield p
        finally:
            tx.close()
            rx.close()
            maps.close()


def fill(port: Port, depth: int) -> None:
    """Queue non-ECT RoCE-class frames (never marked) until the class holds ~depth bytes."""
    while port.roce_backlog()[0] + 1042 <= depth:
        port.send(b"f" * 1000, ROCE_TOS, 1)


def expected_fraction(start_depth: int, count: int) -> float:
    frame = len(PROBE) + FRAME_OVERHEAD
    return sum(mark_probability(start_depth + i * frame, KMIN, KMAX, PMAX) for i in range(count)) / count


@pytest.mark.parametrize("depth", [20_000, 75_000, 110_000, 200_000])
def test_marked_fraction_follows_the_profile_and_receivers_see_every_mark(port: Port, depth: int) -> None:
    port.gate(False)
    time.sleep(0.05)
    fill(port, depth)
    start = port.roce_backlog()[0]
    marked0 = port.maps.table.get(0, "marked", 3)
    probes = 1000
    port.send(PROBE, ROCE_ECT0_TOS, probes)
    marked = port.maps.table.get(0, "marked", 3) - marked0
    port.gate(True)
    got = port.receive_all()

    want = expected_fraction(start, probes)
    print(f"depth {start} B: marked {marked / probes:.3f} of {probes} ECT probes, profile {want:.3f}")
    assert abs(marked / probes - want) <= 0.05, f"depth {start} B: marked {marked / probes:.3f}, profile {want:.3f}"
    probes_ce = sum(ce for n, ce in got if n == len(PROBE))
    assert sum(1 for n, _ in got if n == len(PROBE)) == probes  # nothing dropped
    assert probes_ce == marked  # switch marks == CE seen by the receiver
    assert not any(ce for n, ce in got if n != len(PROBE))  # non-ECT packets are never changed


def test_ecn_disabled_marks_nothing_even_above_kmax(port: Port) -> None:
    port.set_flags(PORT_SWITCH)
    port.gate(False)
    time.sleep(0.05)
    fill(port, 200_000)
    port.send(PROBE, ROCE_ECT0_TOS, 300)
    port.gate(True)
    got = port.receive_all()
    assert port.maps.table.get(0, "marked", 3) == 0
    assert not any(ce for _, ce in got)


def test_accounting_matches_the_qdisc_backlog(port: Port) -> None:
    port.gate(False)
    time.sleep(0.05)
    for size in (1, 100, 700, 1400):  # mixed sizes, held by the closed gate
        port.send(b"a" * size, ROCE_ECT0_TOS, 50)
        ours, kernel = port.roce_backlog()
        assert ours == kernel > 0
    port.gate(True)
    got = port.receive_all()
    assert len([n for n, _ in got if n in (1, 100, 700, 1400)]) >= 199  # one may have left at the close
    assert port.roce_backlog() == (0, 0)


def test_lossy_class_tail_drops_at_its_limit(port: Port) -> None:
    limit = 20_000
    datapath.configure(port.maps, 0, {"limit": [limit] * 8})
    port.gate(False)
    time.sleep(0.05)
    port.send(b"d" * 1000, ROCE_TOS, 40)  # PFC is off: RoCE is a lossy class here
    queued, kernel = port.roce_backlog()
    drops = port.maps.table.get(0, "drops", 3)
    port.gate(True)
    port.receive_all()
    assert queued == kernel <= limit
    assert drops == 40 - queued // 1042 - 1  # the rest; one frame left as the gate closed
    assert queues.class_stats(port.pair.tx_if, port.tx_ns_path)[3].drops == 0  # the programs drop first


IP_RECVERR = 11  # <linux/in.h>: report the device's verdict on each datagram to sendto()


def test_a_dropped_frame_is_a_successful_send_for_the_sender(port: Port) -> None:
    """Open vSwitch sends a switch's output with one sendmmsg() per batch, and discards the rest
    of the batch, uncounted, when one send fails. A frame the port program drops must therefore
    look sent to the sender (TC_ACT_STOLEN): with TC_ACT_SHOT each drop is an ENOBUFS here."""
    datapath.configure(port.maps, 0, {"limit": [20_000] * 8})
    port.gate(False)
    time.sleep(0.05)
    port.tx.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
    try:
        port.send(b"d" * 1000, ROCE_TOS, 40)  # raises ENOBUFS at the first drop if the send failed
    finally:
        port.tx.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 0)
    drops = port.maps.table.get(0, "drops", 3)
    port.gate(True)
    port.receive_all()
    assert drops > 10  # the queue refused frames, and the sender never heard of it


def test_lossless_frames_past_the_headroom_are_kept_and_counted_and_past_the_buffer_dropped(port: Port) -> None:
    """With PFC on, a RoCE frame is admitted against what its INGRESS port holds. Past xoff +
    headroom only a late pause (fabric-emu's, not the modelled link's) can have let it in: kept,
    counted as a headroom overrun. Past the ingress port's buffer: a lossless drop. Frames carry
    their ingress port in the source MAC as the switch's first table writes it (port 5 here), and
    the closed gate keeps them queued, so what port 5 holds is what we set."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    ingress, xoff, headroom, buffer = 5, 10_000, 5_000, 30_000
    datapath.configure(port.maps, 0, {"flags": PORT_SWITCH | PORT_PFC, "limit": [BUFFER] * 8})
    datapath.configure(port.maps, ingress, {"flags": PORT_SWITCH | PORT_PFC, "limit": [buffer] * 8,
                                            "xoff": xoff, "xon": xoff // 2, "headroom": headroom})
    frame = bytes(Ether(src="0e:fe:00:05:00:00", dst="ff:ff:ff:ff:ff:ff")
                  / IP(src=TX_IP, dst=RX_IP, tos=ROCE_TOS) / UDP(sport=PORT, dport=PORT) / (b"L" * 1000))
    raw = run_in_netns(port.pair.tx_ns, lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0))
    raw.bind((port.pair.tx_if, 0))
    t = port.maps.table

    def send_ten_holding(held: int) -> tuple[int, int]:
        """(overruns, lossless drops) of ten frames sent while port 5 holds `held` bytes."""
        t.set(ingress, "held", held, 3)
        overruns, drops = t.get(ingress, "headroom_overruns"), t.get(0, "lossless_drops")
        for _ in range(10):
            raw.send(frame)
        return t.get(ingress, "headroom_overruns") - overruns, t.get(0, "lossless_drops") - drops

    try:
        port.gate(False)
        time.sleep(0.05)
        assert send_ten_holding(xoff + headroom - 1) == (0, 0)  # inside the headroom
        assert send_ten_holding(xoff + headroom + 1) == (10, 0)  # a late pause: kept, counted
        # no room left in the buffer (a dropped frame gives its own bytes back, hence 10 of them)
        assert send_ten_holding(buffer + 10 * len(frame) + 1) == (0, 10)
        queued = port.maps.table.get(0, "queue", 3)
        port.gate(True)
        time.sleep(0.2)
    finally:
        raw.close()
    # the 20 admitted frames (the first may have left as the gate closed), none of the dropped
    assert queued in (19 * len(frame), 20 * len(frame))
    assert port.maps.table.get(0, "queue", 3) == 0  # all of them reached the far end
