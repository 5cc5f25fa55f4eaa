"""RoCEv2 wire format: our packets decode with scapy and carry the ICRC scapy computes."""

import pytest
from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.packet import Raw

from fabric_emu.wire import roce
from fabric_emu.nic.qps import build_qp_table
from fabric_emu.workloads.collectives import ring_edges

SRC, DST, SPORT = "10.99.0.1", "10.99.0.2", 0xC123


def scapy_packet(udp_payload: bytes) -> IP:
    """The IPv4/UDP packet the kernel writes around our payload, decoded by scapy."""
    pkt = IP(src=SRC, dst=DST, tos=roce.TOS_ROCE, id=0, flags="DF", ttl=64) / UDP(
        sport=SPORT, dport=roce.ROCE_UDP_PORT, chksum=0) / Raw(udp_payload)
    return IP(bytes(pkt))


@pytest.mark.parametrize("opcode,payload_len", [
    (roce.RC_RDMA_WRITE_ONLY, 1024),
    (roce.RC_RDMA_WRITE_ONLY, 0),
    (roce.RC_RDMA_WRITE_FIRST, 4096),
    (roce.RC_RDMA_WRITE_MIDDLE, 4096),
    (roce.RC_RDMA_WRITE_LAST, 333),  # needs 3 pad bytes
])
def test_packet_decodes_in_scapy_with_correct_icrc(opcode, payload_len):
    reth = (0x1000, 0xABCD, 8192) if roce.has_reth(opcode) else None
    payload = roce.build_packet(SRC, DST, SPORT, opcode, 0x123456, 0xFFFFFE, payload_len,
                                ackreq=True, reth_fields=reth)
    assert len(payload) == roce.udp_payload_len(opcode, payload_len)
    pkt = scapy_packet(payload)
    bth = pkt[BTH]
    assert (bth.opcode, bth.dqpn, bth.psn, bth.pkey) == (opcode, 0x123456, 0xFFFFFE, 0xFFFF)
    assert (bth.ackreq, bth.fecn, bth.becn, bth.padcount) == (1, 0, 0, roce.pad_len(payload_len))
    assert bth.icrc == int.from_bytes(bth.compute_icrc(None), "big")
    assert roce.check_icrc(SRC, DST, SPORT, payload)
    if reth:
        assert bytes(bth.payload)[:roce.RETH_LEN] == roce.reth(*reth)


def test_icrc_ignores_variant_fields_only():
    payload = roce.build_packet(SRC, DST, SPORT, roce.RC_RDMA_WRITE_ONLY, 7, 1, 64,
                                reth_fields=(0, 0, 64))
    marked = bytearray(payload)
    marked[4] |= 0x40  # BECN is masked by the ICRC
    assert roce.check_icrc(SRC, DST, SPORT, bytes(marked))
    marked[11] ^= 1  # the PSN is not
    assert not roce.check_icrc(SRC, DST, SPORT, bytes(marked))
    assert not roce.check_icrc(SRC, DST, SPORT + 1, payload)


def test_matches_scapy_built_packet():
    """Same bytes as scapy's own BTH build (which computes the ICRC itself)."""
    built = IP(src=SRC, dst=DST, tos=roce.TOS_ROCE, id=0, flags="DF") / UDP(
        sport=SPORT, dport=roce.ROCE_UDP_PORT, chksum=0) / BTH(
        opcode=roce.RC_RDMA_WRITE_MIDDLE, dqpn=99, psn=12345) / Raw(bytes(256))
    ours = roce.build_packet(SRC, DST, SPORT, roce.RC_RDMA_WRITE_MIDDLE, 99, 12345, 256)
    assert bytes(built[UDP].payload) == ours


def test_parse_bth_roundtrip():
    hdr = roce.bth(roce.CNP_OPCODE, 0xABCDEF, 0x1000001, becn=True, ackreq=True)
    assert len(hdr) == roce.BTH_LEN
    assert roce.parse_bth(hdr) == (roce.CNP_OPCODE, 0xABCDEF, 0x000001, True, True)
    assert BTH(hdr + bytes(4)).becn == 1


def test_constants():
    assert roce.TOS_ROCE == 0x6A and roce.TOS_ROCE & 3 == roce.ECN_ECT0
    assert len(roce.reth(1, 2, 3)) == roce.RETH_LEN
    assert roce.frame_len(roce.udp_payload_len(roce.RC_RDMA_WRITE_MIDDLE, 1024)) == 1024 + 16 + 42


@pytest.mark.parametrize("lqpn,rqpn,sport", [
    (1, 1, 0xC001),
    (0x3FFF, 1, 0xFFFF),
    (0x4000, 1, 0xC001),  # bit 14 folds onto bit 0
    (1 << 20, 1, 0xC001),  # bit 20 folds onto bit 0 via v >> 20
    (0x123456, 0x654321, 0xF787),  # p = 0x7336bf94116, fl = 0xA77AE
])
def test_rdma_udp_sport(lqpn, rqpn, sport):
    assert roce.rdma_udp_sport(lqpn, rqpn) == sport
    assert roce.rdma_udp_sport(rqpn, lqpn) == sport  # symmetric, like the kernel's


def test_qp_table_is_reproducible_and_unique():
    edges = ring_edges(["h1", "h2", "h3"])
    table = build_qp_table(edges, 4, seed=7)
    assert table == build_qp_table(edges, 4, seed=7)
    assert table != build_qp_table(edges, 4, seed=8)
    qpns = [q.src_qpn for q in table] + [q.dst_qpn for q in table]
    assert len(set(qpns)) == len(qpns) and all(2 <= q < 1 << 24 for q in qpns)
    for host in ("h1", "h2", "h3"):
        ports = [q.udp_sport for q in table if q.src == host]
        assert len(set(ports)) == len(ports) == 4
        assert all(0xC000 <= p <= 0xFFFF for p in ports)
    unbumped = [q for q in table if q.udp_sport == roce.rdma_udp_sport(q.src_qpn, q.dst_qpn)]
    assert len(unbumped) >= len(table) - 1


@pytest.mark.parametrize("first_len,second_len", [
    (4096, 333),  # a long packet, then a short last one with 3 pad bytes
    (332, 333),  # the first ICRC (at 344..347) sits exactly where the second's pad bytes go
    (331, 333),
    (333, 4096),  # a short packet's ICRC must not stay behind in a later packet's data
])
def test_pad_and_data_bytes_stay_zero_after_other_packets(first_len, second_len):
    prefix = roce.icrc_prefix(SRC, DST, SPORT, roce.udp_payload_len(roce.RC_RDMA_WRITE_MIDDLE, first_len))
    writer = roce.PacketWriter(4096)
    writer.write(prefix, roce.RC_RDMA_WRITE_MIDDLE, 7, 1, first_len)
    opcode = roce.RC_RDMA_WRITE_LAST
    prefix = roce.icrc_prefix(SRC, DST, SPORT, roce.udp_payload_len(opcode, second_len))
    payload = bytes(writer.write(prefix, opcode, 7, 2, second_len))
    pad = roce.pad_len(second_len)
    assert payload[roce.BTH_LEN:-roce.ICRC_LEN] == bytes(second_len + pad)  # data and pad: zeros
    bth = scapy_packet(payload)[BTH]
    assert bth.padcount == pad
    assert bth.icrc == int.from_bytes(bth.compute_icrc(None), "big")
    assert payload == roce.build_packet(SRC, DST, SPORT, opcode, 7, 2, second_len)  # a fresh writer's


def test_a_tiny_packet_icrc_does_not_damage_the_next_reth():
    writer = roce.PacketWriter(4096)
    last = roce.RC_RDMA_WRITE_LAST  # 5 data bytes + 3 pad: its ICRC sits where a RETH goes
    writer.write(roce.icrc_prefix(SRC, DST, SPORT, roce.udp_payload_len(last, 5)), last, 7, 1, 5)
    only = roce.RC_RDMA_WRITE_ONLY
    reth = (0x1000, 0xABCD, 0)
    payload = bytes(writer.write(roce.icrc_prefix(SRC, DST, SPORT, roce.udp_payload_len(only, 0)),
                                 only, 7, 2, 0, reth_fields=reth))
    assert payload == roce.build_packet(SRC, DST, SPORT, only, 7, 2, 0, reth_fields=reth)
    assert payload[roce.BTH_LEN:roce.BTH_LEN + roce.RETH_LEN] == roce.reth(*reth)


def test_cnp_decodes_in_scapy_with_becn_and_correct_icrc():
    payload = roce.build_cnp(SRC, DST, SPORT, 0x0A0B0C)
    assert len(payload) == roce.BTH_LEN + 16 + roce.ICRC_LEN
    pkt = scapy_packet(payload)
    bth = pkt[BTH]
    assert (bth.opcode, bth.dqpn, bth.becn, bth.psn) == (0x81, 0x0A0B0C, 1, 0)
    assert bth.icrc == int.from_bytes(bth.compute_icrc(None), "big")
    assert roce.check_icrc(SRC, DST, SPORT, payload)
