"""Egress shaping measured with real traffic: two namespaces joined by a veth pair, UDP blasted
from one to the other faster than the shaped rate.

All namespaces and links are named fesh<pid>...; addresses are 10.98.0.0/24 inside them only.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from pyroute2 import netns

from fabric_emu.kernel import shaping
from tests.integration.netns_pair import Pair, make_veth, udp_socket, veth_pair

pytestmark = [pytest.mark.root, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

TAG = f"fesh{os.getpid() % 100000}"
BUFFER = 64 * 1024
MTU = 1500
PAYLOAD = 1400
WIRE_BYTES = PAYLOAD + 8 + 20 + 14  # what HTB counts: UDP + IPv4 + Ethernet headers
PORT = 5001
TX_IP, RX_IP = "10.98.0.1", "10.98.0.2"

@pytest.fixture
def pair() -> Iterator[Pair]:
    with veth_pair(TAG, TX_IP, RX_IP) as p:
        yield p


@dataclass
class Run:
    """What one blast measured."""

    rx_bps: float  # wire bits/s seen by the receiver between its first and last packet
    rx_packets: int
    max_backlog: int  # largest bfifo backlog sampled while sending


def blast(p: Pair, seconds: float) -> Run:
    """Send UDP as fast as Python can for seconds; measure at the receiver, sample the queue."""
    rx = udp_socket(p.rx_ns)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    rx.bind((RX_IP, PORT))
    rx.settimeout(0.5)
    tx = udp_socket(p.tx_ns)
    arrivals: list[float] = []
    backlogs: list[int] = []
    sending = threading.Event()
    sending.set()

    def receive() -> None:
        try:
            while True:
                rx.recv(2048)
                arrivals.append(time.monotonic())
        except TimeoutError:  # 0.5 s of silence: the queue has drained
            pass

    def sample() -> None:
        with shaping.IPRoutePool() as pool:
            while sending.is_set():
                backlogs.append(shaping.egress_stats(p.tx_if, p.tx_ns, pool=pool).backlog_bytes)
                time.sleep(0.005)

    threads = [threading.Thread(target=receive), threading.Thread(target=sample)]
    for t in threads:
        t.start()
    payload = b"x" * PAYLOAD
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            tx.sendto(payload, (RX_IP, PORT))
    finally:
        sending.clear()
        for t in threads:
            t.join()
        tx.close()
        rx.close()
    span = arrivals[-1] - arrivals[0]
    return Run((len(arrivals) - 1) * WIRE_BYTES * 8 / span, len(arrivals), max(backlogs))


def assert_rate(measured_bps: float, configured_bps: float) -> None:
    assert abs(measured_bps - configured_bps) <= 0.1 * configured_bps, (
        f"measured {measured_bps / 1e6:.2f} Mb/s, configured {configured_bps / 1e6:.2f} Mb/s"
    )


def test_rate_drops_backlog_and_set_rate(pair: Pair) -> None:
    shaping.shape_egress(pair.tx_if, 20e6, BUFFER, MTU, pair.tx_ns)

    fast = blast(pair, 1.5)
    stats = shaping.egress_stats(pair.tx_if, pair.tx_ns)
    assert_rate(fast.rx_bps, 20e6)
    assert stats.drops > 0, "offered load far above the rate must overflow the bfifo"
    assert 0 < fast.max_backlog <= BUFFER
    assert stats.packets >= fast.rx_packets  # HTB counts what it let out; ARP etc. ride along

    shaping.set_rate(pair.tx_if, 5e6, pair.tx_ns)
    slow = blast(pair, 1.5)
    assert_rate(slow.rx_bps, 5e6)
    assert slow.max_backlog <= BUFFER


def test_set_rate_keeps_queued_packets(pair: Pair) -> None:
    shaping.shape_egress(pair.tx_if, 5e6, BUFFER, MTU, pair.tx_ns)
    rx = udp_socket(pair.rx_ns)
    rx.bind((RX_IP, PORT))
    rx.settimeout(1.0)
    tx = udp_socket(pair.tx_ns)
    try:
        tx.sendto(b"arp", (RX_IP, PORT))
        rx.recv(2048)  # neighbour resolved: the next packets go straight into the queue
        for _ in range(30):  # 30 x 1442 B fit in the 64 KB buffer: nothing is dropped
            tx.sendto(b"x" * PAYLOAD, (RX_IP, PORT))
        queued = shaping.egress_stats(pair.tx_if, pair.tx_ns).backlog_packets
        shaping.set_rate(pair.tx_if, 2e6, pair.tx_ns)
        received = sum(1 for _ in range(30) if rx.recv(2048))  # times out if one is missing
    finally:
        tx.close()
        rx.close()
    assert queued > 10  # 5 Mb/s drains only ~430 packets/s: most were queued at the change
    assert received == 30
    assert shaping.egress_stats(pair.tx_if, pair.tx_ns).drops == 0


def test_shape_egress_is_idempotent(pair: Pair) -> None:
    shaping.shape_egress(pair.tx_if, 20e6, BUFFER, MTU, pair.tx_ns)
    shaping.shape_egress(pair.tx_if, 10e6, 2 * BUFFER, MTU, pair.tx_ns)

    with shaping.open_iproute(pair.tx_ns) as ipr:
        index = ipr.link_lookup(ifname=pair.tx_if)[0]
        qdiscs = {q["handle"]: q for q in ipr.get_qdiscs(index)}
        classes = [c for c in ipr.get_classes(index) if c.get_attr("TCA_KIND") == "htb"]
    assert set(qdiscs) == {shaping.HTB_HANDLE, shaping.FIFO_HANDLE}
    assert qdiscs[shaping.FIFO_HANDLE].get_attr("TCA_KIND") == "bfifo"
    assert qdiscs[shaping.FIFO_HANDLE].get_attr("TCA_OPTIONS")["limit"] == 2 * BUFFER
    assert [c["handle"] for c in classes] == [shaping.CLASS_HANDLE]
    assert classes[0].get_attr("TCA_OPTIONS").get_attr("TCA_HTB_PARMS")["rate"] == 10e6 / 8


def test_netns_given_as_proc_path(pair: Pair) -> None:
    sleeper = subprocess.Popen(["ip", "netns", "exec", pair.tx_ns, "sleep", "30"])
    try:
        path = f"/proc/{sleeper.pid}/ns/net"
        wait_until_in_netns(path, pair.tx_ns)
        shaping.shape_egress(pair.tx_if, 20e6, BUFFER, MTU, path)
        shaping.set_rate(pair.tx_if, 8e6, path)
        assert shaping.egress_stats(pair.tx_if, path).drops == 0
        with shaping.open_iproute(pair.tx_ns) as ipr:  # same namespace seen through its name
            index = ipr.link_lookup(ifname=pair.tx_if)[0]
            (klass,) = [c for c in ipr.get_classes(index) if c["handle"] == shaping.CLASS_HANDLE]
        assert klass.get_attr("TCA_OPTIONS").get_attr("TCA_HTB_PARMS")["rate"] == 8e6 / 8
    finally:
        sleeper.kill()
        sleeper.wait()


def wait_until_in_netns(path: str, name: str) -> None:
    """Wait until the process behind /proc/<pid>/ns/net has entered the named netns."""
    want = os.stat(f"/var/run/netns/{name}").st_ino
    deadline = time.monotonic() + 5
    while os.stat(path).st_ino != want:
        assert time.monotonic() < deadline, "process never entered the namespace"
        time.sleep(0.01)


def test_missing_netns_is_an_error_not_created() -> None:
    missing = f"{TAG}none"
    with pytest.raises(FileNotFoundError):
        shaping.shape_egress(f"{TAG}a", 1e6, BUFFER, MTU, missing)
    assert missing not in netns.listnetns()


@pytest.mark.slow
def test_shaping_200_interfaces_in_100_namespaces() -> None:
    # 100 host namespaces with one link end each, the other 100 ends in one "switch" namespace:
    # the shape of a fabric whose switch ports share the root namespace (Mininet + OVS).
    switch_ns = f"{TAG}sw"
    hosts = [f"{TAG}h{i}" for i in range(100)]
    ports: list[shaping.EgressPort] = []
    created: list[str] = []
    try:
        for ns in [switch_ns, *hosts]:
            netns.create(ns)
            created.append(ns)
        with shaping.open_iproute(switch_ns) as ipr:
            for i, host in enumerate(hosts):
                make_veth(ipr, f"{TAG}h{i}", f"{TAG}s{i}", host, switch_ns)
                ports.append(shaping.EgressPort(f"{TAG}h{i}", 10e6, BUFFER, MTU, host))
                ports.append(shaping.EgressPort(f"{TAG}s{i}", 10e6, BUFFER, MTU, switch_ns))

        shaping.shape_all(ports)

        # Every end got its own tree (speed is measured by benchmarks/startup.py, not here).
        with shaping.IPRoutePool() as pool:
            stats = [shaping.egress_stats(p.ifname, p.netns, pool=pool) for p in ports]
        assert len(stats) == 200 and all(s.backlog_bytes == 0 for s in stats)
    finally:
        for ns in created:
            netns.remove(ns)
