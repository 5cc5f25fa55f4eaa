"""Prebuilt packet templates with an incremental ICRC, ACK/NAK packets and IPv4-level ICRC checks.

The fast paths (QpPackets, AckWriter) are held against the reference builders (build_packet,
build_ack: full CRC32), against scapy's own ICRC and, when tshark is installed, its dissector.
"""

from __future__ import annotations

import random
import shutil
import struct
import subprocess
import zlib

import pytest
from scapy.contrib.roce import AETH, BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw
from scapy.utils import wrpcap

from fabric_emu.wire import roce

SRC, DST, SPORT, QPN = "10.99.0.1", "10.99.0.2", 0xC123, 0x123456
VA, RKEY = 0x7F0012345000, 0xABCD
DATA_OPCODES = (roce.RC_RDMA_WRITE_FIRST, roce.RC_RDMA_WRITE_MIDDLE, roce.RC_RDMA_WRITE_LAST,
                roce.RC_RDMA_WRITE_ONLY, roce.RC_SEND_ONLY)
EDGE_PSNS = (0, 1, 0xFF, 0x100, 0xFFFF, 0x10000, 0xFFFFFE, 0xFFFFFF, 0x1000000, 0x1ABCDEF)


def reference(opcode: int, psn: int, data_len: int, ackreq: bool, message_len: int,
              ip_id: int = 0) -> bytes:
    reth = (VA, RKEY, message_len) if roce.has_reth(opcode) else None
    return roce.build_packet(SRC, DST, SPORT, opcode, QPN, psn, data_len, ackreq=ackreq,
                             reth_fields=reth, ip_id=ip_id)


def qp(mtu: int = 4096, ip_id: int = 0, **kw) -> roce.QpPackets:
    return roce.QpPackets(SRC, DST, SPORT, QPN, mtu, ip_id, va=VA, rkey=RKEY, **kw)


def ip_packet(udp_payload: bytes, *, src: str = SRC, dst: str = DST, sport: int = SPORT,
              ip_id: int = 0, tos: int = roce.TOS_ROCE, ttl: int = 64) -> IP:
    """The IPv4/UDP packet the kernel writes around a payload (DF, UDP checksum 0), decoded."""
    pkt = IP(src=src, dst=dst, tos=tos, id=ip_id, flags="DF", ttl=ttl) / UDP(
        sport=sport, dport=roce.ROCE_UDP_PORT, chksum=0) / Raw(udp_payload)
    return IP(bytes(pkt))


def scapy_icrc_ok(pkt: IP) -> bool:
    bth = pkt[BTH]
    return bth.icrc == int.from_bytes(bth.compute_icrc(None), "big")


# ----------------------------------------------------------------------------- the tables
@pytest.mark.parametrize("trailing", [0, 1, 3, 17, 4100])
def test_byte_table_is_the_crc_change_of_one_byte(trailing):
    table = roce._byte_table(trailing)
    zero = zlib.crc32(bytes(trailing + 1))
    for v in (0, 1, 0x80, 0x5A, 0xFF) + tuple(random.Random(trailing).sample(range(256), 20)):
        assert table[v] == zlib.crc32(bytes([v]) + bytes(trailing)) ^ zero


def test_icrc_prefix_keeps_its_default_and_covers_the_ip_id():
    n = roce.udp_payload_len(roce.RC_RDMA_WRITE_MIDDLE, 1024)
    assert roce.icrc_prefix(SRC, DST, SPORT, n) == roce.icrc_prefix(SRC, DST, SPORT, n, ip_id=0)
    assert roce.icrc_prefix(SRC, DST, SPORT, n) != roce.icrc_prefix(SRC, DST, SPORT, n, ip_id=1)


# ------------------------------------------------------------------- templates vs reference
@pytest.mark.parametrize("mtu,max_templates", [(4096, 64), (1024, 4)])  # 4: evicts constantly
def test_random_template_packets_equal_the_reference(mtu, max_templates):
    rng = random.Random(mtu)
    packets = qp(mtu, max_templates=max_templates)
    for i in range(600):
        opcode = rng.choice(DATA_OPCODES)
        psn = rng.choice(EDGE_PSNS) if i % 3 == 0 else rng.getrandbits(24)
        data_len = rng.choice((0, 1, 2, 3, 5, mtu - 1, mtu, rng.randrange(mtu + 1)))
        ackreq = rng.random() < 0.5
        message_len = rng.choice((data_len, rng.getrandbits(32), 0xFFFFFFFF, 0x01020304))
        got = bytes(packets.packet(opcode, psn, data_len, ackreq, message_len))
        want = reference(opcode, psn, data_len, ackreq, message_len)
        assert got == want, (opcode, psn, data_len, ackreq, message_len)
        assert roce.check_icrc(SRC, DST, SPORT, got)
        assert roce.parse_bth(got) == (opcode, QPN, psn & roce.PSN_MASK, False, ackreq)
    assert len(packets._templates) <= max_templates


def test_psn_wraps_through_one_template():
    packets = qp()
    for psn in range(roce.PSN_MASK - 300, roce.PSN_MASK + 300):  # 0xFFFFFF -> 0
        got = bytes(packets.packet(roce.RC_RDMA_WRITE_MIDDLE, psn, 4096, psn % 7 == 0))
        assert got == reference(roce.RC_RDMA_WRITE_MIDDLE, psn & roce.PSN_MASK, 4096,
                                psn % 7 == 0, 0)


@pytest.mark.parametrize("opcode,data_len", [
    (roce.RC_RDMA_WRITE_ONLY, 0),
    (roce.RC_RDMA_WRITE_ONLY, 1021),
    (roce.RC_RDMA_WRITE_FIRST, 4096),
    (roce.RC_RDMA_WRITE_MIDDLE, 4096),
    (roce.RC_RDMA_WRITE_LAST, 333),  # 3 pad bytes
    (roce.RC_RDMA_WRITE_LAST, 1),
    (roce.RC_SEND_ONLY, 2),
])
@pytest.mark.parametrize("ip_id", [0, 0x1234])
def test_template_icrc_matches_scapy(opcode, data_len, ip_id):
    packets = qp(ip_id=ip_id)
    for psn, ackreq in ((0xFFFFFF, True), (0, False), (0x800001, True)):
        payload = bytes(packets.packet(opcode, psn, data_len, ackreq, 0x10000))
        pkt = ip_packet(payload, ip_id=ip_id)
        bth = pkt[BTH]
        assert (bth.opcode, bth.dqpn, bth.psn, bth.ackreq) == (opcode, QPN, psn, ackreq)
        assert bth.padcount == roce.pad_len(data_len)
        assert scapy_icrc_ok(pkt)
        assert roce.check_icrc_ipv4(bytes(pkt))
        if roce.has_reth(opcode):
            assert bytes(bth.payload)[:roce.RETH_LEN] == roce.reth(VA, RKEY, 0x10000)


def test_pad_and_data_bytes_stay_zero_after_long_then_short_packets():
    packets = qp()
    sequence = [(roce.RC_RDMA_WRITE_FIRST, 4096), (roce.RC_RDMA_WRITE_MIDDLE, 4096),
                (roce.RC_RDMA_WRITE_LAST, 333), (roce.RC_RDMA_WRITE_ONLY, 5),
                (roce.RC_RDMA_WRITE_LAST, 1), (roce.RC_RDMA_WRITE_MIDDLE, 4096),
                (roce.RC_RDMA_WRITE_LAST, 333)]
    for psn, (opcode, data_len) in enumerate(sequence, start=0xFFFFF0):
        payload = bytes(packets.packet(opcode, psn, data_len, True, 0xFFFFFFFF))
        header = roce.BTH_LEN + (roce.RETH_LEN if roce.has_reth(opcode) else 0)
        pad = roce.pad_len(data_len)
        assert payload[header:-roce.ICRC_LEN] == bytes(data_len + pad)  # data and pad: zeros
        assert payload == reference(opcode, psn, data_len, True, 0xFFFFFFFF)


def test_an_evicted_template_keeps_the_bytes_already_handed_out():
    packets = qp(max_templates=2)
    first = packets.packet(roce.RC_RDMA_WRITE_LAST, 9, 100, True)
    kept = bytes(first)
    for n in range(1, 10):
        packets.packet(roce.RC_RDMA_WRITE_LAST, 10 + n, 100 + n, False)
    assert len(packets._templates) == 2
    assert bytes(first) == kept
    assert first.readonly


def test_template_argument_errors():
    with pytest.raises(ValueError):
        qp().packet(roce.RC_RDMA_WRITE_LAST, 0, -1)  # a fresh QpPackets
    packets = qp(mtu=1024)
    with pytest.raises(ValueError):
        packets.packet(roce.RC_RDMA_WRITE_MIDDLE, 0, 1025)
    with pytest.raises(ValueError):
        packets.packet(roce.RC_RDMA_WRITE_LAST, 0, -1)
    with pytest.raises(struct.error):  # a DMA length must fit the RETH's 32 bits
        packets.packet(roce.RC_RDMA_WRITE_ONLY, 0, 8, False, 1 << 32)


def test_packet_writer_equals_the_reference_over_mixed_sequences():
    rng = random.Random(3)
    writer = roce.PacketWriter(4096)  # one shared buffer: earlier packets must not leak
    for _ in range(300):
        opcode = rng.choice(DATA_OPCODES)
        data_len = rng.choice((0, 3, 5, 333, 4095, 4096, rng.randrange(4097)))
        psn, ackreq, message_len = rng.getrandbits(24), rng.random() < 0.5, rng.getrandbits(32)
        reth = (VA, RKEY, message_len) if roce.has_reth(opcode) else None
        prefix = roce.icrc_prefix(SRC, DST, SPORT, roce.udp_payload_len(opcode, data_len))
        got = bytes(writer.write(prefix, opcode, QPN, psn, data_len, ackreq=ackreq,
                                 reth_fields=reth))
        assert got == reference(opcode, psn, data_len, ackreq, message_len)


# ------------------------------------------------------------------------------ ACK / NAK
@pytest.mark.parametrize("syndrome", [roce.AETH_ACK, roce.AETH_NAK_PSN_SEQ])
def test_ack_and_nak_validate_and_parse_back(syndrome):
    writer = roce.AckWriter(DST, SRC, SPORT, QPN)
    rng = random.Random(syndrome)
    for psn in EDGE_PSNS + tuple(rng.getrandbits(24) for _ in range(50)):
        msn = rng.getrandbits(24)
        want = roce.build_ack(DST, SRC, SPORT, QPN, psn, syndrome, msn)
        got = bytes(writer.ack(psn, syndrome, msn))
        assert got == want and len(got) == roce.BTH_LEN + roce.AETH_LEN + roce.ICRC_LEN
        assert roce.check_icrc(DST, SRC, SPORT, got)
        assert roce.parse_bth(got) == (roce.RC_ACKNOWLEDGE, QPN, psn & roce.PSN_MASK,
                                       False, False)
        assert roce.parse_aeth(got) == (syndrome, msn)
    pkt = ip_packet(got, src=DST, dst=SRC)
    assert pkt[BTH].opcode == roce.RC_ACKNOWLEDGE
    assert (pkt[AETH].syndrome, pkt[AETH].msn) == (syndrome, msn)
    assert scapy_icrc_ok(pkt)
    assert roce.check_icrc_ipv4(bytes(pkt))


def test_ack_writer_with_ip_id():
    got = bytes(roce.AckWriter(DST, SRC, SPORT, QPN, ip_id=77).ack(5, roce.AETH_ACK, 2))
    assert got == roce.build_ack(DST, SRC, SPORT, QPN, 5, roce.AETH_ACK, 2, ip_id=77)
    assert roce.check_icrc(DST, SRC, SPORT, got, ip_id=77)
    assert not roce.check_icrc(DST, SRC, SPORT, got)


# --------------------------------------------------------------------------- check_icrc_ipv4
def test_check_icrc_ipv4_uses_the_real_ip_id():
    payload = bytes(qp().packet(roce.RC_RDMA_WRITE_LAST, 42, 333, True))
    good = bytes(ip_packet(payload))
    assert roce.check_icrc_ipv4(good)
    changed_id = bytes(ip_packet(payload, ip_id=1))  # as a connected socket would send it
    assert not roce.check_icrc_ipv4(changed_id)
    raw = bytearray(good)
    raw[4:6] = b"\x12\x34"  # the ID alone, header checksum left stale: still rejected
    assert not roce.check_icrc_ipv4(bytes(raw))
    # the same packet built for id 0x1234 is fine with it
    payload = bytes(qp(ip_id=0x1234).packet(roce.RC_RDMA_WRITE_LAST, 42, 333, True))
    assert roce.check_icrc_ipv4(bytes(ip_packet(payload, ip_id=0x1234)))
    assert not roce.check_icrc(SRC, DST, SPORT, payload)  # assumes id 0


def test_check_icrc_ipv4_ignores_variant_fields_and_ethernet_padding():
    payload = roce.build_cnp(SRC, DST, SPORT, 0x0A0B0C)
    marked = bytes(ip_packet(payload, tos=roce.TOS_ROCE | roce.ECN_CE, ttl=3))
    assert roce.check_icrc_ipv4(marked)
    assert roce.check_icrc_ipv4(marked + bytes(6))  # trailing Ethernet padding
    fecn = bytearray(marked)
    fecn[20 + 8 + 4] ^= 0x80  # FECN: masked
    assert roce.check_icrc_ipv4(bytes(fecn))
    psn = bytearray(marked)
    psn[20 + 8 + 11] ^= 1  # the PSN is covered
    assert not roce.check_icrc_ipv4(bytes(psn))
    assert not roce.check_icrc_ipv4(marked[:-1])  # truncated
    assert not roce.check_icrc_ipv4(b"\x60" + marked[1:])  # not IPv4
    tcp = bytearray(marked)
    tcp[9] = 6
    assert not roce.check_icrc_ipv4(bytes(tcp))


def test_check_icrc_ipv4_with_ip_options():
    """IP options are covered like the rest of the header (scapy computes this ICRC itself)."""
    pkt = IP(src=SRC, dst=DST, id=0, flags="DF", options=b"\x01\x01\x01\x00") / UDP(
        sport=SPORT, dport=roce.ROCE_UDP_PORT, chksum=0) / BTH(
        opcode=roce.RC_RDMA_WRITE_MIDDLE, dqpn=QPN, psn=1) / Raw(bytes(64))
    pkt = IP(bytes(pkt))
    assert pkt.ihl == 6 and scapy_icrc_ok(pkt)
    assert roce.check_icrc_ipv4(bytes(pkt))
    payload = bytes(pkt[UDP].payload)  # the same UDP payload without the options: wrong ICRC
    assert not roce.check_icrc_ipv4(bytes(ip_packet(payload)))


# --------------------------------------------------------------------------------- tshark
def _tshark_prefs() -> list[str]:
    """The brief's EoIB switch where this tshark still has it (4.0 reports it obsolete)."""
    prefs = subprocess.run(["tshark", "-G", "defaultprefs"], capture_output=True, text=True)
    return ["-o", "infiniband.dissect_eoib:FALSE"] if "dissect_eoib" in prefs.stdout else []


@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark not installed")
def test_tshark_dissects_data_ack_nak_and_cnp(tmp_path):
    data = bytes(qp().packet(roce.RC_RDMA_WRITE_ONLY, 7, 100, True, 100))
    ack = roce.build_ack(DST, SRC, SPORT, QPN, 7, roce.AETH_ACK, 1)
    nak = bytes(roce.AckWriter(DST, SRC, SPORT, QPN).ack(8, roce.AETH_NAK_PSN_SEQ, 1))
    cnp = roce.build_cnp(DST, SRC, SPORT, QPN)
    frames = [Ether() / ip_packet(data)] + [Ether() / ip_packet(p, src=DST, dst=SRC)
                                             for p in (ack, nak, cnp)]
    for frame in frames:
        assert roce.check_icrc_ipv4(bytes(frame[IP]))
    pcap = tmp_path / "roce.pcap"
    wrpcap(str(pcap), frames)
    fields = ["infiniband.bth.opcode", "infiniband.bth.psn", "infiniband.aeth.syndrome",
              "infiniband.aeth.msn", "infiniband.reth.dmalen"]
    out = subprocess.run(["tshark", "-r", str(pcap), *_tshark_prefs(), "-T", "fields",
                          *[arg for f in fields for arg in ("-e", f)]],
                         capture_output=True, text=True, check=True).stdout
    rows = [line.split("\t") for line in out.splitlines()]
    parsed = [tuple(int(v, 0) if v else None for v in row) for row in rows]
    assert parsed == [
        (roce.RC_RDMA_WRITE_ONLY, 7, None, None, 100),
        (roce.RC_ACKNOWLEDGE, 7, roce.AETH_ACK, 1, None),
        (roce.RC_ACKNOWLEDGE, 8, roce.AETH_NAK_PSN_SEQ, 1, None),
        (roce.CNP_OPCODE, 0, None, None, None),
    ]
