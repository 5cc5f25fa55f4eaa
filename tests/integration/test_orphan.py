"""A host's frames leave their socket at the switch port they enter by (bpf/port.c orphan()),
measured with real packets on a kernel path that, like Open vSwitch's kernel datapath, keeps
the sender's socket on each frame it forwards (tests/integration/orphan_path.py): the host
sends lossless frames that wait past the switch port, in a closed queue.

Without PORT_ORPHAN the sender's socket still owns every frame held there (SIOCOUTQ: the
kernel's count of its send buffer in use), the end-to-end back-pressure that stopped a 7:1
incast's senders on the kernel datapath before PFC could act; with it, the socket owns none of
them, and each frame goes on once and is charged to the switch port once.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
import termios
import time
from collections.abc import Iterator

import pytest

from tests.integration.orphan_path import FAR_IP, ROCE_TOS, SWITCH, OrphanPath, orphan_path

pytestmark = [pytest.mark.root, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

PAYLOAD = 1000
FRAME = PAYLOAD + 14 + 20 + 8  # as the tc programs count it: Ethernet, IPv4, UDP
FRAMES = 40


@pytest.fixture
def path() -> Iterator[OrphanPath]:
    with orphan_path(f"feor{os.getpid() % 100000}", hold=True) as p:
        yield p


def send_and_hold(path: OrphanPath, orphan: bool) -> tuple[int, int]:
    """FRAMES lossless frames from the host, held past the switch port; (bytes of the sender's
    send buffer still in use, packets held)."""
    path.set_orphan(orphan)
    sock = path.host_socket(tos=0)
    try:
        sock.sendto(b"r" * PAYLOAD, (FAR_IP, 4791))  # not lossless: takes the closed gate's one burst
        time.sleep(0.2)
        before = path.held_at_out()
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, ROCE_TOS)
        for _ in range(FRAMES):
            sock.sendto(b"r" * PAYLOAD, (FAR_IP, 4791))
        time.sleep(0.3)  # every frame through the switch port, into the closed queue
        outq = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
        return outq, path.held_at_out() - before
    finally:
        sock.close()


def test_without_orphaning_the_sender_owns_what_the_switch_holds(path: OrphanPath) -> None:
    """The control: what the test measures is there to be removed."""
    outq, held = send_and_hold(path, orphan=False)
    print(f"not orphaned: {held} frames held past the switch, the sender's send buffer {outq} B in use")
    assert held == FRAMES
    assert outq >= FRAMES * PAYLOAD


def test_a_frame_leaves_its_senders_socket_at_the_switch_port_and_is_charged_once(path: OrphanPath) -> None:
    outq, held = send_and_hold(path, orphan=True)
    t = path.maps.table
    handoff, ingress = t.get(SWITCH, "handoff_charges"), t.get(SWITCH, "ingress_charges")
    print(f"orphaned: {held} frames held past the switch, the sender's send buffer {outq} B in use; "
          f"{handoff} charged on hand-off, {ingress} at ingress")
    assert held == FRAMES  # each frame went on exactly once: its clone, not the frame and its clone
    assert outq == 0
    assert t.get(SWITCH, "held", 3) == FRAMES * FRAME
    assert handoff + ingress == FRAMES
