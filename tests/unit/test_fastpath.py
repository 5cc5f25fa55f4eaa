"""The compiled send and receive path (fabric_emu/nic/fastpath.c) over real UDP sockets on
loopback: its packets are byte for byte the reference builder's, ICRC included, and its receive
records say what the packets said, merged only where the responder may take them as a run."""

from __future__ import annotations

import socket

import pytest

from fabric_emu.wire import roce
from fabric_emu.nic import fastpath

IP = "127.0.0.1"
QPN, VA, RKEY = 0x0012AB, 0, 0x0012AB
FIRST, MIDDLE = roce.RC_RDMA_WRITE_FIRST, roce.RC_RDMA_WRITE_MIDDLE
LAST, ONLY = roce.RC_RDMA_WRITE_LAST, roce.RC_RDMA_WRITE_ONLY
MTU = 1024


@pytest.fixture
def pair():
    """(sender socket, receiver socket, receiver port): UDP on loopback, non-blocking."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind((IP, 0))
    rx.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    rx.setblocking(False)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.bind((IP, 0))
    tx.setblocking(False)
    yield tx, rx, rx.getsockname()[1]
    tx.close()
    rx.close()


def sender(tx: socket.socket, port: int) -> fastpath.QpSender:
    s = fastpath.QpSender([roce.QpPackets(IP, IP, tx.getsockname()[1], QPN, MTU, va=VA, rkey=RKEY)],
                          [tx], IP)
    s._addr = fastpath.sockaddr(IP, port)  # the test's receiver, not port 4791
    s._addr_p = fastpath.ctypes.addressof(s._addr)
    return s


def drain(rx: socket.socket) -> list[bytes]:
    out = []
    while True:
        try:
            out.append(rx.recv(65536))
        except BlockingIOError:
            return out


def test_sent_packets_equal_the_reference_builder(pair):
    tx, rx, port = pair
    s, sport = sender(tx, port), tx.getsockname()[1]
    message = 5 * MTU + 3
    start = roce.PSN_MASK - 1  # the MIDDLE run crosses the PSN wrap
    assert s.send_run(FIRST, start, MTU, 1, False, message) == (1, roce.udp_payload_len(FIRST, MTU))
    assert s.send_run(MIDDLE, start + 1, MTU, 4, False, message)[0] == 4
    assert s.send_run(LAST, 3, 3, 1, True, message)[0] == 1
    assert s.send_run(ONLY, 4, 0, 1, True, 0)[0] == 1
    want = [roce.build_packet(IP, IP, sport, FIRST, QPN, start, MTU, reth_fields=(VA, RKEY, message))]
    want += [roce.build_packet(IP, IP, sport, MIDDLE, QPN, (start + i) & roce.PSN_MASK, MTU)
             for i in range(1, 5)]
    want.append(roce.build_packet(IP, IP, sport, LAST, QPN, 3, 3, ackreq=True))
    want.append(roce.build_packet(IP, IP, sport, ONLY, QPN, 4, 0, ackreq=True, reth_fields=(VA, RKEY, 0)))
    got = drain(rx)
    assert got == want
    assert all(roce.check_icrc(IP, IP, sport, p) for p in got)


def test_socket_errors_other_than_a_full_socket_raise(pair):
    tx, rx, port = pair
    s = sender(tx, port)
    tx.close()  # its descriptor is gone: EBADF (a full socket returns 0 instead; see
    # tests/integration/test_agent.py for the kernel pacing a QP through it)
    with pytest.raises(OSError, match="Bad file descriptor"):
        s.send_run(MIDDLE, 0, MTU, 5, False, 0)


def records(rx: socket.socket) -> list[tuple[int, ...]]:
    r = fastpath.Receiver(rx)
    return [rec for batch in r.batches() for rec in batch]


def test_receive_merges_in_order_middles_of_one_qp_only(pair):
    tx, rx, port = pair
    sport = tx.getsockname()[1]

    def send(opcode, qpn, psn, data=MTU, ackreq=False, reth=None):
        tx.sendto(roce.build_packet(IP, IP, sport, opcode, qpn, psn, data, ackreq=ackreq,
                                    reth_fields=reth), (IP, port))

    send(FIRST, QPN, 10, reth=(0, 0, 9 * MTU))
    for psn in (11, 12, 13):
        send(MIDDLE, QPN, psn)
    send(MIDDLE, QPN, 15)  # a gap: a new record
    send(MIDDLE, 0x99, 16)  # another QP: a new record
    send(MIDDLE, QPN, 16)
    send(MIDDLE, QPN, 17, ackreq=True)  # AckReq: never merged
    send(LAST, QPN, 18, data=5)
    tx.sendto(roce.build_ack(IP, IP, sport, QPN, 42, 0x60, 7), (IP, port))
    tx.sendto(b"\x11" * 8, (IP, port))  # too short for a BTH and an ICRC
    got = records(rx)
    # (qpn, psn, count, bytes, aeth, ce, opcode, ackreq, malformed, has_aeth); a WRITE's aeth is
    # just the word after its BTH (the RETH's first on FIRST, data zeros otherwise)
    assert got == [
        (QPN, 10, 1, MTU, 0, 0, FIRST, 0, 0, 1),
        (QPN, 11, 3, 3 * MTU, 0, 0, MIDDLE, 0, 0, 1),
        (QPN, 15, 1, MTU, 0, 0, MIDDLE, 0, 0, 1),
        (0x99, 16, 1, MTU, 0, 0, MIDDLE, 0, 0, 1),
        (QPN, 16, 1, MTU, 0, 0, MIDDLE, 0, 0, 1),
        (QPN, 17, 1, MTU, 0, 0, MIDDLE, 1, 0, 1),
        (QPN, 18, 1, 5, 0, 0, LAST, 0, 0, 1),
        (QPN, 42, 1, 0, 0x60 << 24 | 7, 0, roce.RC_ACKNOWLEDGE, 0, 0, 1),
        (0, 0, 1, 0, 0, 0, 0, 0, 1, 0),
    ]


def test_receive_counts_ce_marks_and_reads_in_batches(pair):
    tx, rx, port = pair
    sport = tx.getsockname()[1]
    n = 3 * fastpath.RX_RECORDS + 5  # more than one call's records
    for i in range(n):
        # every other packet ECN CE (UDP sockets may set the ECN bits of their TOS): CE does
        # not split a run, it is counted in it
        tx.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, (roce.DSCP_ROCE << 2) | (3 if i % 2 else 2))
        qpn = QPN if i % 100 else 0x77  # a foreign QP now and then splits the run
        tx.sendto(roce.build_packet(IP, IP, sport, MIDDLE, qpn, i, 64), (IP, port))
    r = fastpath.Receiver(rx)
    got = [rec for batch in r.batches() for rec in batch]
    assert r.packets == n
    assert sum(rec[2] for rec in got) == n
    assert sum(rec[5] for rec in got) == n // 2
    assert sum(rec[3] for rec in got) == 64 * n
    # runs break only at the foreign QP's packets (and where a batch ended)
    assert len([rec for rec in got if rec[0] == 0x77]) == len(range(0, n, 100))
    assert len(got) <= 2 * len(range(0, n, 100)) + 1 + n // 64


def test_spraying_rotates_the_sockets_by_psn_each_with_its_own_icrc(pair):
    _tx, rx, port = pair
    socks = []
    for _ in range(4):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((IP, 0))
        s.setblocking(False)
        socks.append(s)
    try:
        sports = [s.getsockname()[1] for s in socks]
        packets = [roce.QpPackets(IP, IP, p, QPN, MTU, va=VA, rkey=RKEY) for p in sports]
        sender = fastpath.QpSender(packets, socks, IP)
        sender._addr = fastpath.sockaddr(IP, port)
        sender._addr_p = fastpath.ctypes.addressof(sender._addr)
        start = roce.PSN_MASK - 2
        assert sender.send_run(MIDDLE, start, MTU, 9, True, 0)[0] == 9
        got = []
        while True:
            try:
                data, (_ip, sport) = rx.recvfrom(65536)
            except BlockingIOError:
                break
            got.append((sport, data))
        assert len(got) == 9
        for i, (sport, data) in enumerate(got):
            psn = (start + i) & roce.PSN_MASK
            assert sport == sports[psn % 4]  # PSN p leaves from socket p mod 4
            assert data == roce.build_packet(IP, IP, sport, MIDDLE, QPN, psn, MTU, ackreq=i == 8)
    finally:
        for s in socks:
            s.close()
    with pytest.raises(ValueError, match="power of two"):
        fastpath.QpSender(packets[:3], socks[:3], IP)
