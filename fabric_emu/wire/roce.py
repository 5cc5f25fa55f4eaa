"""RoCEv2 wire format (IPv4/UDP 4791/BTH/[RETH|AETH]/payload/pad/ICRC), pure and socket-free.

The NIC engine hands UDP payloads to a kernel UDP socket, so this module builds everything
above UDP and computes the ICRC over the IPv4/UDP headers the kernel *will* write:
version/IHL 0x45, DF, protocol 17, UDP checksum 0 (SO_NO_CHECK) and an IP identification
(default 0). TOS, TTL, the IP header checksum, the UDP checksum and the BTH F/B/reserved bits
are masked to ones in the ICRC, so switches may rewrite ECN or TTL without breaking it. The IP
identification is NOT masked: the ICRC covers it.

Senders must therefore use *unconnected* UDP sockets with IP_MTU_DISCOVER = IP_PMTUDISC_DO
(DF): Linux then writes IP id 0 (ip_select_ident_segs: no inet_daddr and DF -> id 0). A
connected socket gets its own incrementing id per packet and every ICRC built here for id 0
would be wrong. Code that knows a different id passes ``ip_id=``; ``check_icrc_ipv4`` verifies a
captured IPv4 packet with the id (and every other field) it really carries.

Send path. ``QpPackets`` keeps prebuilt UDP payloads per (opcode, data length) for one queue
pair and patches only the PSN, the AckReq bit, the RETH DMA length and the ICRC per packet.
The ICRC is updated incrementally instead of running CRC32 over the payload: CRC32 is affine
over GF(2), so for equal-length messages crc(a) ^ crc(b) = L(a ^ b) with L linear, and
L(a ^ b) is the XOR of one table lookup per changed byte (``_byte_table``). ``AckWriter`` does
the same for ACK/NAK packets. ``build_packet``, ``build_ack`` and ``build_cnp`` are the plain
reference builders (full CRC32), used for one-off packets and to validate the fast path.

Layout and masking follow scapy's ``scapy.contrib.roce.BTH.compute_icrc``; facts and sources in
docs/reference/protocol_facts.md §1.
"""

from __future__ import annotations

import socket
import struct
import zlib
from collections import OrderedDict
from functools import lru_cache
from typing import NamedTuple

ROCE_UDP_PORT = 4791

# RC opcodes (transport bits 000) and the congestion notification packet.
RC_SEND_ONLY = 0x04
RC_RDMA_WRITE_FIRST = 0x06
RC_RDMA_WRITE_MIDDLE = 0x07
RC_RDMA_WRITE_LAST = 0x08
RC_RDMA_WRITE_ONLY = 0x0A
RC_ACKNOWLEDGE = 0x11
CNP_OPCODE = 0x81

# AETH syndromes: bits 6-5 say ACK (00), RNR NAK (01) or NAK (11); bits 4-0 the credit count
# or the NAK code. 0x1F = ACK with "no credit count"; 0x60 = NAK, PSN sequence error.
AETH_ACK = 0x1F
AETH_NAK_PSN_SEQ = 0x60

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
AETH_LEN = 4
ICRC_LEN = 4
# Bytes an Ethernet frame adds to a UDP payload (no FCS): what the emulated line rate counts.
FRAME_OVERHEAD = UDP_HEADER_LEN + IPV4_HEADER_LEN + ETH_HEADER_LEN

_OPCODES_WITH_RETH = frozenset({RC_RDMA_WRITE_FIRST, RC_RDMA_WRITE_ONLY})

# opcode, SE|M|PadCnt|TVer, P_Key, F|B|resv6|DestQP, A|resv7|PSN
_BTH = struct.Struct(">BBHII")
_RETH = struct.Struct(">QII")  # virtual address, R_Key, DMA length
_ICRC = struct.Struct("<I")  # the CRC is stored byte-reversed
_U32 = struct.Struct(">I")  # the BTH PSN word, the RETH DMA length, the AETH
_pack_u32 = _U32.pack_into  # bound once: the per-packet paths call these
_pack_icrc = _ICRC.pack_into
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


def aeth(syndrome: int, msn: int) -> bytes:
    """The 4-byte ACK Extended Transport Header: syndrome (8 bits), MSN (24 bits)."""
    return _U32.pack((syndrome & 0xFF) << 24 | (msn & 0xFFFFFF))


def parse_bth(buf: bytes | bytearray | memoryview) -> tuple[int, int, int, bool, bool]:
    """(opcode, dest_qp, psn, becn, ackreq) from the start of a UDP payload."""
    opcode, _flags, _pkey, qp_word, psn_word = _BTH.unpack_from(buf, 0)
    return (opcode, qp_word & QPN_MASK, psn_word & PSN_MASK,
            bool(qp_word & _BECN), bool(psn_word & _ACKREQ))


def parse_aeth(buf: bytes | bytearray | memoryview) -> tuple[int, int]:
    """(syndrome, msn) of the AETH right after the BTH of an ACK's UDP payload."""
    word = _U32.unpack_from(buf, BTH_LEN)[0]
    return word >> 24, word & 0xFFFFFF


@lru_cache(maxsize=4096)
def icrc_prefix(src_ip: str, dst_ip: str, sport: int, payload_len: int,
                dport: int = ROCE_UDP_PORT, ip_id: int = 0) -> int:
    """Running CRC32 of the ICRC pseudo-header up to the BTH: 8 x 0xFF, masked IPv4 and UDP.

    payload_len is the UDP payload length (BTH to ICRC). ip_id is the IPv4 identification the
    kernel will write: 0 for DF packets from an unconnected socket (see the module docstring);
    the ICRC covers it. The result depends only on addresses, ports, id and length, so the send
    path computes it once per (QP, packet length) and continues the CRC over BTH and payload.
    """
    udp_len = UDP_HEADER_LEN + payload_len
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0xFF, IPV4_HEADER_LEN + udp_len, ip_id, _IP_DF,
                     0xFF, socket.IPPROTO_UDP, 0xFFFF,
                     socket.inet_aton(src_ip), socket.inet_aton(dst_ip))
    udp = struct.pack(">HHHH", sport, dport, udp_len, 0xFFFF)
    return zlib.crc32(udp, zlib.crc32(ip, zlib.crc32(_ONES8)))


def _icrc(prefix_crc: int, body: bytes | bytearray | memoryview) -> int:
    """The ICRC of a UDP payload without its last 4 bytes (BTH ... pad), by plain CRC32."""
    masked_bth = bytearray(body[:BTH_LEN])
    masked_bth[4] = 0xFF  # F, B and resv6 count as ones in the ICRC
    return zlib.crc32(body[BTH_LEN:], zlib.crc32(masked_bth, prefix_crc))


def _with_icrc(src_ip: str, dst_ip: str, sport: int, body: bytes, ip_id: int) -> bytes:
    """body (BTH ... pad) followed by its ICRC: the reference path, a full CRC32."""
    prefix = icrc_prefix(src_ip, dst_ip, sport, len(body) + ICRC_LEN, ip_id=ip_id)
    return body + _ICRC.pack(_icrc(prefix, body))


def check_icrc(src_ip: str, dst_ip: str, sport: int, udp_payload: bytes, *,
               ip_id: int = 0) -> bool:
    """True when the last 4 bytes of a received UDP payload are its correct ICRC.

    Assumes the IPv4 header the sender's kernel writes (DF, identification ip_id, no options);
    check_icrc_ipv4 checks a captured packet against the header it really has.
    """
    prefix = icrc_prefix(src_ip, dst_ip, sport, len(udp_payload), ip_id=ip_id)
    return _ICRC.pack(_icrc(prefix, udp_payload[:-ICRC_LEN])) == udp_payload[-ICRC_LEN:]


def check_icrc_ipv4(ip_packet: bytes | bytearray | memoryview) -> bool:
    """True when a whole captured IPv4/UDP RoCEv2 packet carries its correct ICRC.

    Uses the packet's own header fields (identification, flags, options, lengths) with the
    variant ones (TOS, TTL, IP checksum, UDP checksum, BTH F/B/resv6) masked. Bytes after the IP
    total length (Ethernet padding) are ignored. False for anything that is not an unfragmented
    IPv4 UDP packet long enough to hold a BTH and an ICRC.
    """
    buf = bytes(ip_packet)
    if len(buf) < IPV4_HEADER_LEN or buf[0] >> 4 != 4:
        return False
    ihl = (buf[0] & 0x0F) * 4
    total = int.from_bytes(buf[2:4], "big")
    frag = int.from_bytes(buf[6:8], "big")
    if (ihl < IPV4_HEADER_LEN or total > len(buf) or buf[9] != socket.IPPROTO_UDP
            or frag & 0x3FFF):  # MF or a fragment offset: no whole ICRC here
        return False
    udp_len = int.from_bytes(buf[ihl + 4:ihl + 6], "big")
    if udp_len != total - ihl or udp_len < UDP_HEADER_LEN + BTH_LEN + ICRC_LEN:
        return False
    ip = bytearray(buf[:ihl])
    ip[1] = ip[8] = 0xFF  # TOS, TTL
    ip[10:12] = b"\xff\xff"  # header checksum
    udp = bytearray(buf[ihl:ihl + UDP_HEADER_LEN])
    udp[6:8] = b"\xff\xff"  # checksum
    prefix = zlib.crc32(udp, zlib.crc32(ip, zlib.crc32(_ONES8)))
    payload = buf[ihl + UDP_HEADER_LEN:total]
    return _ICRC.pack(_icrc(prefix, payload[:-ICRC_LEN])) == payload[-ICRC_LEN:]


# ---------------------------------------------------------------- incremental ICRC
# A byte that changes by XOR v, with `trailing` covered bytes after it, changes the CRC32 of
# a fixed-length message by L(v, 0 x trailing), independent of everything before it. Tables
# are shared by all QPs; the bound keeps odd workloads (many lengths) from growing memory.
_TABLE_CACHE = 512


@lru_cache(maxsize=_TABLE_CACHE)
def _byte_table(trailing: int) -> tuple[int, ...]:
    """T[v] = CRC32 change when a byte with `trailing` covered bytes after it changes by v."""
    zeros = bytes(trailing + 1)
    zero_crc = zlib.crc32(zeros)
    one_bit = bytearray(zeros)
    bits = []
    for k in range(8):  # 8 CRC32 calls; the other 248 entries follow by linearity
        one_bit[0] = 1 << k
        bits.append(zlib.crc32(one_bit) ^ zero_crc)
    table = [0] * 256
    for v in range(1, 256):
        low = v & -v
        table[v] = table[v ^ low] ^ bits[low.bit_length() - 1]
    return tuple(table)


def _field_tables(offset: int, width: int, covered_len: int) -> tuple[tuple[int, ...], ...]:
    """Tables for the bytes offset .. offset+width-1 (most significant first) of a field in a
    UDP payload whose ICRC-covered part (BTH ... pad) is covered_len bytes long."""
    return tuple(_byte_table(covered_len - 1 - pos) for pos in range(offset, offset + width))


_PSN_AT = 8  # the A|resv7|PSN word in the BTH
_DMA_LEN_AT = BTH_LEN + 12  # the DMA length in the RETH
_AETH_AT = BTH_LEN


class TemplateFields(NamedTuple):
    """One QpPackets template, field by field: header (BTH, RETH where the opcode has one; PSN
    and DMA length still to be written), the zero data and pad bytes after it, the ICRC with PSN
    0, AckReq clear and DMA length 0, and the ICRC changes per PSN / DMA-length byte."""

    header: bytes
    body_len: int
    crc: int
    ackreq_delta: int
    psn_tables: tuple[tuple[int, ...], ...]  # 3 tables, most significant byte first
    dma_tables: tuple[tuple[int, ...], ...] | None  # 4 tables, or None without a RETH


class QpPackets:
    """Prebuilt RC data packets of one queue pair, with an incremental ICRC.

    One buffer per (opcode, data length) holds BTH (this QP's DestQP, PadCnt), RETH where the
    opcode has one (va, rkey; DMA length patched per packet), zero data and zero pad bytes.
    Per packet only the PSN word, the RETH DMA length and the ICRC are written, always at the
    same offsets, so data and pad bytes stay zero by construction. Templates are made lazily;
    at most max_templates are kept (least recently used go first).
    """

    def __init__(self, src_ip: str, dst_ip: str, sport: int, dest_qp: int, mtu: int,
                 ip_id: int = 0, *, va: int = 0, rkey: int = 0, max_templates: int = 64):
        self.src_ip, self.dst_ip, self.sport = src_ip, dst_ip, sport
        self.dest_qp = dest_qp & QPN_MASK
        self.mtu = mtu
        self.ip_id = ip_id
        self.va, self.rkey = va, rkey
        self.max_templates = max_templates
        self._templates: OrderedDict[int, tuple] = OrderedDict()  # LRU: oldest first
        self._last_key: int | None = None  # the most recently used template, checked first
        self._last: tuple = ()

    def packet(self, opcode: int, psn: int, data_len: int, ackreq: bool = False,
               message_len: int = 0) -> memoryview:
        """The UDP payload of one packet, ready for sendto.

        message_len is the RETH DMA length (used on WRITE_FIRST/ONLY only). The returned
        read-only view is valid until the next call with the same (opcode, data_len).
        """
        key = opcode << 32 | data_len
        if key == self._last_key:  # runs of MIDDLE packets skip the LRU bookkeeping
            t = self._last
        else:
            t = self._lookup(key, opcode, data_len)
        buf, view, crc, crc_ackreq, psn_hi, psn_mid, psn_lo, dma, icrc_at = t
        psn &= PSN_MASK
        if ackreq:
            _pack_u32(buf, _PSN_AT, psn | _ACKREQ)
            crc = crc_ackreq
        else:
            _pack_u32(buf, _PSN_AT, psn)
        if dma is not None:
            _pack_u32(buf, _DMA_LEN_AT, message_len)  # raises unless 0 <= len < 2**32
            d3, d2, d1, d0 = dma
            crc ^= (d3[message_len >> 24] ^ d2[message_len >> 16 & 0xFF]
                    ^ d1[message_len >> 8 & 0xFF] ^ d0[message_len & 0xFF])
        _pack_icrc(buf, icrc_at,
                   crc ^ psn_hi[psn >> 16] ^ psn_mid[psn >> 8 & 0xFF] ^ psn_lo[psn & 0xFF])
        return view

    def fields(self, opcode: int, data_len: int) -> TemplateFields:
        """The template of (opcode, data_len) as a compiled sender needs it (agent/fastpath)."""
        buf, _view, crc, crc_ackreq, psn_hi, psn_mid, psn_lo, dma, covered = self._lookup(
            opcode << 32 | data_len, opcode, data_len)
        header_len = BTH_LEN + (RETH_LEN if dma is not None else 0)
        return TemplateFields(bytes(buf[:header_len]), covered - header_len, crc, crc ^ crc_ackreq,
                              (psn_hi, psn_mid, psn_lo), dma)

    def _lookup(self, key: int, opcode: int, data_len: int) -> tuple:
        """The template for key, made if needed, now the most recently used one."""
        templates = self._templates
        t = templates.get(key)
        if t is None:
            t = templates[key] = self._template(opcode, data_len)
            if len(templates) > self.max_templates:
                templates.popitem(last=False)
        else:
            templates.move_to_end(key)
        self._last_key, self._last = key, t
        return t

    def _template(self, opcode: int, data_len: int) -> tuple:
        if not 0 <= data_len <= self.mtu:
            raise ValueError(f"data length {data_len} B outside 0..{self.mtu} B")
        pad = pad_len(data_len)
        header = _BTH.pack(opcode, pad << 4, DEFAULT_PKEY, self.dest_qp, 0)
        with_reth = opcode in _OPCODES_WITH_RETH
        if with_reth:
            header += _RETH.pack(self.va, self.rkey, 0)
        body = header + bytes(data_len + pad)
        covered = len(body)
        prefix = icrc_prefix(self.src_ip, self.dst_ip, self.sport, covered + ICRC_LEN,
                             ip_id=self.ip_id)
        crc = _icrc(prefix, body)  # with PSN 0, AckReq 0, DMA length 0
        buf = bytearray(body + bytes(ICRC_LEN))
        a_bit = _byte_table(covered - 1 - _PSN_AT)[0x80]
        psn_hi, psn_mid, psn_lo = _field_tables(_PSN_AT + 1, 3, covered)
        dma = _field_tables(_DMA_LEN_AT, 4, covered) if with_reth else None
        return (buf, memoryview(buf).toreadonly(), crc, crc ^ a_bit, psn_hi, psn_mid, psn_lo,
                dma, covered)


class AckWriter:
    """Prebuilt ACK/NAK packet (BTH opcode 0x11 + AETH) for one QP, incremental ICRC.

    src/dst/sport are the responder's side (the ACK goes back to the requester); dest_qp is the
    requester's QP. Per ACK only the PSN, the AETH and the ICRC are written.
    """

    def __init__(self, src_ip: str, dst_ip: str, sport: int, dest_qp: int, ip_id: int = 0):
        body = (_BTH.pack(RC_ACKNOWLEDGE, 0, DEFAULT_PKEY, dest_qp & QPN_MASK, 0)
                + aeth(0, 0))
        covered = len(body)
        prefix = icrc_prefix(src_ip, dst_ip, sport, covered + ICRC_LEN, ip_id=ip_id)
        self._crc = _icrc(prefix, body)
        self._buf = bytearray(body + bytes(ICRC_LEN))
        self._view = memoryview(self._buf).toreadonly()
        self._psn = _field_tables(_PSN_AT + 1, 3, covered)
        self._aeth = _field_tables(_AETH_AT, 4, covered)

    def ack(self, psn: int, syndrome: int = AETH_ACK, msn: int = 0) -> memoryview:
        """The ACK's UDP payload; the read-only view is valid until the next ack()."""
        buf = self._buf
        psn &= PSN_MASK
        word = (syndrome & 0xFF) << 24 | (msn & 0xFFFFFF)
        _pack_u32(buf, _PSN_AT, psn)
        _pack_u32(buf, _AETH_AT, word)
        p2, p1, p0 = self._psn
        a3, a2, a1, a0 = self._aeth
        crc = (self._crc ^ p2[psn >> 16] ^ p1[psn >> 8 & 0xFF] ^ p0[psn & 0xFF]
               ^ a3[word >> 24] ^ a2[word >> 16 & 0xFF] ^ a1[word >> 8 & 0xFF] ^ a0[word & 0xFF])
        _pack_icrc(buf, _AETH_AT + AETH_LEN, crc)
        return self._view


def build_ack(src_ip: str, dst_ip: str, sport: int, dest_qp: int, psn: int, syndrome: int,
              msn: int, *, ip_id: int = 0) -> bytes:
    """An RC ACK/NAK's UDP payload: BTH (opcode 0x11) + AETH + ICRC (reference path)."""
    body = bth(RC_ACKNOWLEDGE, dest_qp, psn) + aeth(syndrome, msn)
    return _with_icrc(src_ip, dst_ip, sport, body, ip_id)


class PacketWriter:
    """Builds RC packets into one preallocated buffer: no allocation and no scapy per packet.

    Data and pad bytes are zeros. The returned view is valid until the next write(). Kept for
    existing callers; QpPackets is the faster send path (no CRC32 over the payload per packet)
    and tests hold both against build_packet.
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
                 reth_fields: tuple[int, int, int] | None = None, ip_id: int = 0) -> bytes:
    """One packet's UDP payload (BTH ... ICRC), zero data: the reference for the send path.

    Built field by field with a full CRC32, independently of QpPackets and PacketWriter, so
    tests can hold both against it: QpPackets(src_ip, dst_ip, sport, dest_qp, mtu, ip_id,
    va=va, rkey=rkey).packet(opcode, psn, payload_len, ackreq, dma_len) gives the same bytes.
    """
    pad = pad_len(payload_len)
    body = bth(opcode, dest_qp, psn, padcount=pad, ackreq=ackreq)
    if opcode in _OPCODES_WITH_RETH:
        if reth_fields is None:
            raise ValueError(f"opcode {opcode:#x} needs a RETH")
        body += reth(*reth_fields)
    body += bytes(payload_len + pad)
    return _with_icrc(src_ip, dst_ip, sport, body, ip_id)


CNP_RESERVED_LEN = 16
DSCP_CNP = 48
TOS_CNP = DSCP_CNP << 2  # not ECN-capable


def build_cnp(src_ip: str, dst_ip: str, sport: int, dest_qp: int, *, ip_id: int = 0) -> bytes:
    """A RoCEv2 congestion notification packet's UDP payload: BTH (opcode 0x81, BECN set, to
    the sender's QP, PSN 0), 16 reserved bytes, ICRC (docs/reference/protocol_facts.md §1.4)."""
    body = bth(CNP_OPCODE, dest_qp, 0, becn=True) + bytes(CNP_RESERVED_LEN)
    return _with_icrc(src_ip, dst_ip, sport, body, ip_id)


def rdma_udp_sport(lqpn: int, rqpn: int) -> int:
    """UDP source port Linux gives a RoCEv2 QP without a flow label.

    rdma_get_udp_sport(rdma_calc_flow_label(lqpn, rqpn)) from include/rdma/ib_verbs.h.
    """
    fl = (lqpn * rqpn) & 0xFFFFFFFFFFFFFFFF
    fl ^= fl >> 20
    fl ^= fl >> 40
    fl &= 0xFFFFF
    return 0xC000 | ((fl & 0x3FFF) ^ ((fl & 0xFC000) >> 14))
