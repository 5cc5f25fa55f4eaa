"""The DLB flowlet stage (bpf/port.c dlb_uplink in host_egress) run on crafted packets with
BPF_PROG_TEST_RUN: the real program and table, the kernel's clock, no fabric."""

from __future__ import annotations

import shutil
import struct
import subprocess
import time
import uuid

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from fabric_emu.kernel import bpfsys
from fabric_emu.ports import datapath
from fabric_emu.ports.dlb import TTL_BASE, DlbTable

pytestmark = [pytest.mark.root]

INACTIVITY_NS = 20_000_000  # 20 ms: gaps the test can make with time.sleep
LEAF, OTHER = 1, 2


@pytest.fixture
def stage():
    pins = datapath.BPFFS / "fabric-emu" / f"test-dlb-{uuid.uuid4().hex[:8]}"
    datapath.ensure_bpffs()
    pins.mkdir(parents=True)
    try:
        subprocess.run(["bpftool", "prog", "loadall", str(datapath.build_object()), str(pins / "progs"),
                        "pinmaps", str(pins / "maps")], check=True, capture_output=True)
        table = DlbTable.open(pins)
        table.configure(LEAF, inactivity_ns=INACTIVITY_NS, window_ns=10 * INACTIVITY_NS, n_uplinks=4,
                        allowed={OTHER: 0b1111})
        table.enable(LEAF, True)
        fd = bpfsys.obj_get(str(pins / "progs" / "host_egress"))
        yield table, fd
        table.close()
    finally:
        shutil.rmtree(pins, ignore_errors=True)


def send(fd: int, sport: int, *, src=f"10.0.{LEAF}.1", dst=f"10.0.{OTHER}.1", dport=4791,
         payload: int = 1000) -> IP:
    frame = bytes(Ether() / IP(src=src, dst=dst, ttl=64, tos=26 << 2) / UDP(sport=sport, dport=dport)
                  / bytes(payload))
    ret, out = bpfsys.prog_test_run(fd, frame)
    assert ret == 0  # TC_ACT_OK
    header = out[14:34]
    words = sum(struct.unpack("!10H", header))
    while words >> 16:
        words = (words & 0xFFFF) + (words >> 16)
    assert words == 0xFFFF, "the IP checksum does not match the header (TTL rewritten without it?)"
    return Ether(out)[IP]


def uplink(pkt: IP) -> int | None:
    return pkt.ttl - TTL_BASE if pkt.ttl >= TTL_BASE else None


def test_a_flowlet_keeps_its_uplink_and_new_flows_take_the_least_loaded(stage):
    table, fd = stage
    first = uplink(send(fd, 0xC001))
    assert first is not None and all(uplink(send(fd, 0xC001)) == first for _ in range(20))
    # three more flows arrive while the first is busy: each takes an uplink nobody loads yet
    others = [uplink(send(fd, sport)) for sport in (0xC002, 0xC003, 0xC004)]
    assert sorted([first, *others]) == [0, 1, 2, 3]
    c = table.counters(LEAF, 4)
    assert c["flowlets"] == [1, 1, 1, 1] and c["moves"] == [0, 0, 0, 0]
    assert c["packets"][first] == 21


def test_after_a_gap_longer_than_the_inactivity_a_flow_may_move(stage):
    table, fd = stage
    a = uplink(send(fd, 0xC001))
    for _ in range(30):  # flow B loads another uplink heavily
        b = uplink(send(fd, 0xC002, payload=1400))
    assert b != a
    time.sleep(2 * INACTIVITY_NS / 1e9)
    for _ in range(50):
        send(fd, 0xC002, payload=1400)  # B goes on (its own new flowlet, same uplink: least loaded)
    again = uplink(send(fd, 0xC001))  # A's next flowlet: not onto B's busy uplink
    assert again != uplink(send(fd, 0xC002))
    assert sum(table.counters(LEAF, 4)["flowlets"]) >= 3


def test_masks_other_traffic_and_disabled_stage_leave_packets_alone(stage):
    table, fd = stage
    table.set_allowed(LEAF, {OTHER: 0b0100})  # only uplink 2 reaches the other leaf
    assert all(uplink(send(fd, 0xC000 + i)) == 2 for i in range(5))
    assert uplink(send(fd, 0xC010, dst=f"10.0.{LEAF}.2")) is None  # same leaf: no uplink
    assert uplink(send(fd, 0xC011, dport=53)) is None  # not RoCE
    table.set_allowed(LEAF, {OTHER: 0})
    assert uplink(send(fd, 0xC012)) is None  # nothing reaches: the routes decide
    table.set_allowed(LEAF, {OTHER: 0b1111})
    table.enable(LEAF, False)
    assert uplink(send(fd, 0xC013)) is None and send(fd, 0xC013).ttl == 64


def test_the_gap_can_be_changed_live(stage):
    table, fd = stage
    send(fd, 0xC001)
    time.sleep(0.003)
    send(fd, 0xC001)  # 3 ms < 20 ms: the same flowlet
    assert sum(table.counters(LEAF, 4)["flowlets"]) == 1
    table.set_timing(LEAF, inactivity_ns=1_000_000)  # 1 ms now
    time.sleep(0.003)
    send(fd, 0xC001)  # 3 ms > 1 ms: a new flowlet
    assert sum(table.counters(LEAF, 4)["flowlets"]) == 2
