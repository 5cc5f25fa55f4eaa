"""The per-queue-pair rate limiters of a host NIC, measured with real packets: a veth pair
between two namespaces, the tx end shaped and programmed as a fabric does a host NIC (class
tree with HTB 30: inside the RoCE gate, host_egress + qp_classify), queue pairs as UDP sockets
carrying their SO_MARK, rates read from the receiver's kernel timestamps per source port.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from fabric_emu.wire import roce
from fabric_emu.ports import datapath, queues
from fabric_emu.ports.model import NIC_QUEUE_FRAMES, PortEnd
from fabric_emu.kernel import rtnl
from fabric_emu.kernel.rtnl import link_index
from fabric_emu.ports.qp_limiter import QP_MAJOR, QpLimiter, qp_class, qp_mark
from fabric_emu.kernel.shaping import IPRoutePool
from tests.integration.netns_pair import Pair, recorded_pins, udp_socket, veth_pair

pytestmark = [pytest.mark.root, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

TAG = f"feql{os.getpid() % 100000}"
TX_IP, RX_IP, PORT = "10.95.0.1", "10.95.0.2", 4791
LINK, MTU = 40e6, 1500
PAYLOAD = 1400
FRAME = PAYLOAD + 14 + 20 + 8  # as HTB counts it
SPORT = {0: 20000, 1: 20001, None: 20009}  # source port of QP 0, QP 1, the unmarked socket
SO_MARK = 36
SO_TIMESTAMPNS = SCM_TIMESTAMPNS = 35


class Receiver:
    """Every datagram to RX_IP:PORT as (kernel receive time, source port), from a thread."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.log: list[tuple[float, int]] = []
        self._stop = threading.Event()
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        sock.settimeout(0.05)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                _, anc, _, addr = self.sock.recvmsg(4096, socket.CMSG_SPACE(16))
            except TimeoutError:
                continue
            stamp = next(data for level, kind, data in anc if level == socket.SOL_SOCKET and kind == SCM_TIMESTAMPNS)
            sec, nsec = struct.unpack("=qq", stamp[:16])
            self.log.append((sec + nsec * 1e-9, addr[1]))

    def times(self, k: int | None, t0: float, t1: float = float("inf")) -> list[float]:
        return [t for t, port in list(self.log) if port == SPORT[k] and t0 <= t < t1]

    def rate_bps(self, k: int | None, t0: float, t1: float) -> float:
        return len(self.times(k, t0, t1)) * FRAME * 8 / (t1 - t0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@dataclass
class Nic:
    pair: Pair
    limiter: QpLimiter
    gate: queues.Gate
    rx: Receiver
    socks: dict[int | None, socket.socket]
    sent: dict[int | None, int] = field(default_factory=lambda: {k: 0 for k in SPORT})

    @property
    def tx_ns(self) -> str:
        return f"/var/run/netns/{self.pair.tx_ns}"

    def blast(self, seconds: float, which: tuple[int | None, ...] = (0, 1)) -> float:
        """Keep the sockets' queues full for `seconds` (send until EAGAIN, sleep 1 ms, again);
        returns the start time."""
        payload = b"q" * PAYLOAD
        start = time.time()
        while time.time() < start + seconds:
            for k in which:
                while True:
                    try:
                        self.socks[k].sendto(payload, (RX_IP, PORT))
                    except BlockingIOError:
                        break
                    self.sent[k] += 1
            time.sleep(0.001)
        return start

    def open_gate(self) -> None:
        self.gate.set(True)
        # A closed TBF is not rescheduled by the change (pfcd sends a kick frame the same way).
        self.socks[None].sendto(b"kick", (RX_IP, PORT + 1))

    def qp_classes(self) -> dict[int, dict]:
        """Kernel stats of the QP classes by class id: packets sent and backlog."""
        with IPRoutePool() as pool:
            ipr = pool.get(self.tx_ns)
            index = ipr.link_lookup(ifname=self.pair.tx_if)[0]
            out = {}
            for c in ipr.get_classes(index):
                if c["handle"] >> 16 == QP_MAJOR >> 16:
                    stats = c.get_attr("TCA_STATS2")
                    out[c["handle"]] = {"packets": stats.get_attr("TCA_STATS_BASIC")["packets"],
                                        "backlog": stats.get_attr("TCA_STATS_QUEUE")["backlog"]}
            return out


def _tx_socket(pair: Pair, k: int | None, sndbuf: int) -> socket.socket:
    s = udp_socket(pair.tx_ns)
    s.bind((TX_IP, SPORT[k]))
    s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, roce.TOS_ROCE)  # DSCP 26: class 1:13
    if k is not None:
        s.setsockopt(socket.SOL_SOCKET, SO_MARK, qp_mark(k))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    s.setblocking(False)
    return s


# A TBF limit far below what the gate will hold: with HTB 30: below it the limit must not apply.
ROCE_LIMIT = 2 * (MTU + 14)


@pytest.fixture
def nic() -> Iterator[Nic]:
    with veth_pair(TAG, TX_IP, RX_IP) as pair, recorded_pins("test-feql") as pins:
        tx_ns = f"/var/run/netns/{pair.tx_ns}"
        nic_queue = NIC_QUEUE_FRAMES * (MTU + 14)
        queues.shape_classes(queues.PortQueues(pair.tx_if, LINK, MTU, {0: 2_000_000, 3: ROCE_LIMIT, 6: nic_queue},
                                               tx_ns, qp_classes=True))
        maps = datapath.PortMaps(pins)
        nl = rtnl.netlink_socket(tx_ns)
        rx_sock = udp_socket(pair.rx_ns)
        rx_sock.bind((RX_IP, PORT))
        rx = Receiver(rx_sock)
        # A QP socket holds ~40 frames (19 ms at 24 Mbit/s): a sender the machine holds for a
        # few ms between sends must not run its class dry (4 frames did, once, on a busy CI).
        socks = {k: _tx_socket(pair, k, 32 * FRAME if k is not None else 64 * FRAME) for k in SPORT}
        try:
            datapath.attach(pins, [PortEnd(1, "h", 0, pair.tx_if, 0, "host", 100, LINK)], {"h": tx_ns}, maps)
            index = link_index(nl, pair.tx_if)
            n = Nic(pair, QpLimiter(nl, index, MTU, ifname=pair.tx_if),
                    queues.Gate(nl, pair.tx_if, index, LINK, MTU, ROCE_LIMIT), rx, socks)
            socks[None].sendto(b"arp", (RX_IP, PORT + 1))  # resolve the neighbour first
            time.sleep(0.1)
            yield n
        finally:
            for s in socks.values():
                s.close()
            rx.close()
            nl.close()
            maps.close()


def assert_rate(got: float, want: float, what: str) -> None:
    print(f"{what}: {got / 1e6:.3f} Mbit/s (class rate {want / 1e6:.1f})")
    assert abs(got - want) <= 0.1 * want, f"{what}: {got / 1e6:.2f} Mbit/s, class rate {want / 1e6:.1f}"


def test_queue_pairs_get_their_class_rates_and_the_pfc_gate_holds_them(nic: Nic) -> None:
    nic.limiter.add(0, 8e6)
    nic.limiter.add(1, 16e6)
    t0 = nic.blast(2.0)
    assert_rate(nic.rx.rate_bps(0, t0 + 0.3, t0 + 2.0), 8e6, "QP 0")
    assert_rate(nic.rx.rate_bps(1, t0 + 0.3, t0 + 2.0), 16e6, "QP 1")

    nic.limiter.set_rate(0, 24e6)
    t1 = nic.blast(1.5)
    assert_rate(nic.rx.rate_bps(0, t1 + 0.2, t1 + 1.5), 24e6, "QP 0 raised")
    assert_rate(nic.rx.rate_bps(1, t1 + 0.2, t1 + 1.5), 16e6, "QP 1")

    nic.gate.set(False)
    closed = time.time()
    nic.blast(0.5)
    after = {k: len(nic.rx.times(k, closed)) for k in (0, 1)}
    print(f"packets arriving after the gate closed: {after}")
    assert all(n <= 2 for n in after.values())

    # The gate holds more than its TBF limit without a drop, and the RoCE class's stats (the
    # TBF's) count it all: every packet sent and not received.
    time.sleep(0.1)
    held = sum(nic.sent[k] - len(nic.rx.times(k, 0)) for k in (0, 1))
    roce = queues.class_stats(nic.pair.tx_if, nic.tx_ns)[queues.LOSSLESS]
    print(f"held by the closed gate: {held} packets, TBF backlog {roce.backlog_packets} packets "
          f"{roce.backlog_bytes} B, drops {roce.drops}")
    assert roce.backlog_packets == held and roce.backlog_bytes == held * FRAME > ROCE_LIMIT
    assert roce.drops == 0

    nic.open_gate()
    t2 = nic.blast(1.5)
    assert_rate(nic.rx.rate_bps(0, t2 + 0.2, t2 + 1.5), 24e6, "QP 0 after the gate opened")
    assert_rate(nic.rx.rate_bps(1, t2 + 0.2, t2 + 1.5), 16e6, "QP 1 after the gate opened")


def test_unmarked_packets_bypass_the_qp_classes(nic: Nic) -> None:
    nic.limiter.add(0, 8e6)
    nic.limiter.add(1, 16e6)
    before = nic.qp_classes()
    t0 = nic.blast(1.5, which=(None,))
    rate = nic.rx.rate_bps(None, t0 + 0.2, t0 + 1.5)
    print(f"unmarked RoCE-class packets: {rate / 1e6:.2f} Mbit/s on a {LINK / 1e6:.0f} Mbit/s link")
    assert rate > 0.8 * LINK  # no QP class's rate: HTB 30:'s direct queue, then the link
    assert nic.qp_classes() == before  # not a packet through a QP class


def test_set_rate_cost(nic: Nic) -> None:
    nic.limiter.add(0, 8e6)
    calls = 1000
    start = time.perf_counter()
    for i in range(calls):
        nic.limiter.set_rate(0, 8e6 + i * 1000)
    per_call = (time.perf_counter() - start) / calls
    print(f"set_rate: {per_call * 1e6:.1f} us per call ({calls} calls)")
    assert qp_class(0) in nic.qp_classes()


def test_a_raise_waits_out_the_gap_charged_at_the_old_rate(nic: Nic) -> None:
    """Kernel behaviour the NIC model has to live with (see qp_limiter's docstring): HTB
    charges a departing packet at the rate then in force and keeps that time debt across a
    rate change, so after a deep cut a raise takes effect only when the old gap has passed."""
    low, high = 100e3, 24e6
    nic.limiter.add(0, 8e6)
    worker = threading.Thread(target=nic.blast, args=(1.0, (0,)))
    worker.start()
    time.sleep(0.3)
    nic.limiter.set_rate(0, low)
    cut = time.time()
    while not nic.rx.times(0, cut):  # the next departure: the first one charged at `low`
        time.sleep(0.0005)
    departed = nic.rx.times(0, cut)[0]
    time.sleep(0.01)
    nic.limiter.set_rate(0, high)
    raised = time.time()
    worker.join()
    after = nic.rx.times(0, raised)
    old_gap, new_gap = FRAME * 8 / low, FRAME * 8 / high
    print(f"raised {1e3 * (raised - departed):.1f} ms after a departure at {low / 1e3:.0f} kbit/s: "
          f"next departure {1e3 * (after[0] - departed):.1f} ms after it (gap at the old rate "
          f"{1e3 * old_gap:.1f} ms, at the new {1e3 * new_gap:.2f} ms); then gaps of "
          f"{[round(1e3 * (b - a), 2) for a, b in zip(after, after[1:5])]} ms")
    assert after[0] - departed > 0.8 * old_gap  # not promptly: the debt of the old rate stands
    assert after[0] - departed < old_gap + 0.02
    assert_rate(nic.rx.rate_bps(0, after[0], after[0] + 0.2), high, "then")
