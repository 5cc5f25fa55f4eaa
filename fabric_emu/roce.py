"""RoCEv2 wire format (IPv4/UDP 4791/BTH/[RETH]/payload/pad/ICRC), pure and socket-free.

The host agent hands UDP payloads to a kernel UDP socket, so this module builds everything
above UDP and computes the ICRC over the IPv4/UDP headers the kernel *will* write:
version/IHL 0x45, identification 0 (an unconnected socket with IP_PMTUDISC_DO sends DF packets
with id 0), DF, protocol 17, UDP checksum 0 (SO_NO_CHECK). TOS, TTL, the IP header checksum,
the UDP checksum and the BTH F/B/reserved bits are masked to ones in the ICRC, so switches may
rewrite ECN or TTL without breaking it. Layout and masking follow scapy's
``scapy.contrib.roce.BTH.compute_icrc``; facts and sources in docs/reference/protocol_facts.md §1.
"""

from __future__ import annotations

import socket
import struct
import zlib
from functools import lru_cache

ROCE_UDP_PORT = 4791

# RC opcodes (transport bits 000) and the congestion notification packet.
RC_SEND_ONLY = 0x04
RC_RDMA_WRITE_FIRST = 0x06
RC_RDMA_WRITE_MIDDLE = 0x07
RC_RDMA_WRITE_LAST = 0x08
RC_RDMA_WRITE_ONLY = 0x0A
CNP_OPCODE = 0x81

DSCP_ROCE = 26
ECN_ECT0 = 0b10
ECN_CE = 0b11
TOS_ROCE = (DSCP_ROCE << 2) | ECN_ECT0

DEFAULT_PKEY = 0xFFFF
PSN_MASK = 0xFFFFFF
QPN_MASK = 0xFFFFFF

IPV4_HEADER_LEN = 20
UDP_HEADER_LEN = 8
ETH_HEADER_LEN = 14
BTH_LEN = 12
RETH_LEN = 16
ICRC_LEN = 4
# Bytes an Ethernet frame adds to a UDP payload (no FCS): what the emulated line rate counts.
FRAME_OVERHEAD = UDP_HEADER_LEN + IPV4_HEADER_LEN + ETH_HEADER_LEN

_OPCODES_WITH_RETH = frozenset({RC_RDMA_WRITE_FIRST, RC_RDMA_WRITE_ONLY})

# opcode, SE|M|PadCnt|TVer, P_Key, F|B|resv6|DestQP, A|resv7|PSN
_BTH = struct.Struct(">BBHII")
_RETH = struct.Struct(">QII")  # virtual address, R_Key, DMA length
_ICRC = struct.Struct("<I")  # the CRC is stored byte-reversed
_BTH_VARIANT_BITS = 0xFF000000  # F, B and resv6 in the DestQP word
_BECN = 0x40000000
_ACKREQ = 0x80000000
_IP_DF = 0x4000
_ONES8 = b"\xff" * 8  # stands in for the InfiniBand LRH
_ZERO_ICRC = bytes(ICRC_LEN)


def has_reth(opcode: int) -> bool:
    return opcode in _OPCODES_WITH_RETH


def pad_len(payload_len: int) -> int:
    """Pad bytes that bring an IB payload to a multiple of 4 (the BTH PadCnt)."""
    return -payload_len & 3


def udp_payload_len(opcode: int, payload_len: int) -> int:
    """Length of the UDP payload carrying payload_len data bytes with this opcode."""
    reth = RETH_LEN if opcode in _OPCODES_WITH_RETH else 0
    return BTH_LEN + reth + payload_len + pad_len(payload_len) + ICRC_LEN


def frame_len(udp_payload: int) -> int:
    """Ethernet frame bytes (without FCS) around a UDP payload of this many bytes."""
    return udp_payload + FRAME_OVERHEAD


def bth(opcode: int, dest_qp: int, psn: int, *, padcount: int = 0, becn: bool = False,
        ackreq: bool = False, pkey: int = DEFAULT_PKEY) -> bytes:
    """The 12-byte Base Transport Header."""
    qp_word = (dest_qp & QPN_MASK) | (_BECN if becn else 0)
    psn_word = (psn & PSN_MASK) | (_ACKREQ if ackreq else 0)
    return _BTH.pack(opcode, padcount << 4, pkey, qp_word, psn_word)


def reth(va: int, rkey: int, dma_len: int) -> bytes:
    """The 16-byte RDMA Extended Transport Header (on WRITE_FIRST and WRITE_ONLY)."""
    return _RETH.pack(va, rkey, dma_len)


def parse_bth(buf: bytes | bytearray | memoryview) -> tuple[int, int, int, bool, bool]:
    """(opcode, dest_qp, psn, becn, ackreq) from the start of a UDP payload."""
    opcode, _flags, _pkey, qp_word, psn_word = _BTH.unpack_from(buf, 0)
    return (opcode, qp_word & QPN_MASK, psn_word & PSN_MASK,
            bool(qp_word & _BECN), bool(psn_word & _ACKREQ))


@lru_cache(maxsize=4096)
def icrc_prefix(src_ip: str, dst_ip: str, sport: int, payload_len: int,
                dport: int = ROCE_UDP_PORT) -> int:
    """Running CRC32 of the ICRC pseudo-header up to the BTH: 8 x 0xFF, masked IPv4 and UDP.

    payload_len is the UDP payload length (BTH to ICRC). The result depends only on addresses,
    ports and length, so the send path computes it once per (QP, packet length) and continues
    the CRC over BTH and payload per packet.
    """
    udp_len = UDP_HEADER_LEN + payload_len
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0xFF, IPV4_HEADER_LEN + udp_len, 0, _IP_DF,
                     0xFF, socket.IPPROTO_UDP, 0xFFFF,
                     socket.inet_aton(src_ip), socket.inet_aton(dst_ip))
    udp = struct.pack(">HHHH", sport, dport, udp_len, 0xFFFF)
    return zlib.crc32(udp, zlib.crc32(ip, zlib.crc32(_ONES8)))


def check_icrc(src_ip: str, dst_ip: str, sport: int, udp_payload: bytes) -> bool:
    """True when the last 4 bytes of a received UDP payload are its correct ICRC."""
    bth_masked = bytearray(udp_payload[:BTH_LEN])
    bth_masked[4] = 0xFF
    crc = zlib.crc32(bth_masked, icrc_prefix(src_ip, dst_ip, sport, len(udp_payload)))
    crc = zlib.crc32(udp_payload[BTH_LEN:-ICRC_LEN], crc)
    return _ICRC.pack(crc) == udp_payload[-ICRC_LEN:]


class PacketWriter:
    """Builds RC packets into one preallocated buffer: no allocation and no scapy per packet.

    Data and pad bytes are zeros. The returned view is valid until the next write().
    """

    def __init__(self, max_payload: int):
        self._buf = bytearray(BTH_LEN + RETH_LEN + max_payload + 3 + ICRC_LEN)
        self._view = memoryview(self._buf)
        self._pseudo_bth = bytearray(BTH_LEN)
        self._max_payload = max_payload
        self._reth_dirty = False
        self._icrc_at = 0  # where the last ICRC went: data or pad bytes of a longer packet

    def write(self, prefix_crc: int, opcode: int, dest_qp: int, psn: int, payload_len: int,
              *, ackreq: bool = False, reth_fields: tuple[int, int, int] | None = None
              ) -> memoryview:
        """The UDP payload of one packet; prefix_crc = icrc_prefix(..., udp_payload_len())."""
        if payload_len > self._max_payload:
            raise ValueError(f"payload {payload_len} B exceeds {self._max_payload} B")
        buf = self._buf
        pad = -payload_len & 3
        has_reth = opcode in _OPCODES_WITH_RETH
        end = BTH_LEN + (RETH_LEN if has_reth else 0) + payload_len + pad
        if self._icrc_at != end:  # keep data and pad bytes zero where an earlier ICRC sat
            buf[self._icrc_at:self._icrc_at + ICRC_LEN] = _ZERO_ICRC
            self._icrc_at = end
        psn_word = (psn & PSN_MASK) | (_ACKREQ if ackreq else 0)
        _BTH.pack_into(buf, 0, opcode, pad << 4, DEFAULT_PKEY, dest_qp, psn_word)
        # The ICRC sees F, B and resv6 as ones; the wire carries zeros.
        _BTH.pack_into(self._pseudo_bth, 0, opcode, pad << 4, DEFAULT_PKEY,
                       _BTH_VARIANT_BITS | dest_qp, psn_word)
        if has_reth:
            if reth_fields is None:
                raise ValueError(f"opcode {opcode:#x} needs a RETH")
            _RETH.pack_into(buf, BTH_LEN, *reth_fields)
            self._reth_dirty = True
        elif self._reth_dirty:  # keep data bytes zero after a RETH packet used the space
            buf[BTH_LEN:BTH_LEN + RETH_LEN] = bytes(RETH_LEN)
            self._reth_dirty = False
        crc = zlib.crc32(self._view[BTH_LEN:end], zlib.crc32(self._pseudo_bth, prefix_crc))
        _ICRC.pack_into(buf, end, crc)
        return self._view[:end + ICRC_LEN]


def build_packet(src_ip: str, dst_ip: str, sport: int, opcode: int, dest_qp: int, psn: int,
                 payload_len: int, *, ackreq: bool = False,
                 reth_fields: tuple[int, int, int] | None = None) -> bytes:
    """One packet's UDP payload (BTH ... ICRC), built by the same code as the send path."""
    prefix = icrc_prefix(src_ip, dst_ip, sport, udp_payload_len(opcode, payload_len))
    packet = PacketWriter(payload_len).write(prefix, opcode, dest_qp, psn, payload_len,
                                             ackreq=ackreq, reth_fields=reth_fields)
    return bytes(packet)


CNP_RESERVED_LEN = 16
DSCP_CNP = 48
TOS_CNP = DSCP_CNP << 2  # not ECN-capable


def build_cnp(src_ip: str, dst_ip: str, sport: int, dest_qp: int) -> bytes:
    """A RoCEv2 congestion notification packet's UDP payload: BTH (opcode 0x81, BECN set, to
    the sender's QP, PSN 0), 16 reserved bytes, ICRC (docs/reference/protocol_facts.md §1.4)."""
    prefix = icrc_prefix(src_ip, dst_ip, sport, BTH_LEN + CNP_RESERVED_LEN + ICRC_LEN)
    wire = bth(CNP_OPCODE, dest_qp, 0, becn=True) + bytes(CNP_RESERVED_LEN)
    masked = bytearray(wire)
    masked[4] = 0xFF  # F, B and resv6 count as ones in the ICRC
    return wire + _ICRC.pack(zlib.crc32(masked, prefix))


def rdma_udp_sport(lqpn: int, rqpn: int) -> int:
    """UDP source port Linux gives a RoCEv2 QP without a flow label.

    rdma_get_udp_sport(rdma_calc_flow_label(lqpn, rqpn)) from include/rdma/ib_verbs.h.
    """
    fl = (lqpn * rqpn) & 0xFFFFFFFFFFFFFFFF
    fl ^= fl >> 20
    fl ^= fl >> 40
    fl &= 0xFFFFF
    return 0xC000 | ((fl & 0x3FFF) ^ ((fl & 0xFC000) >> 14))
