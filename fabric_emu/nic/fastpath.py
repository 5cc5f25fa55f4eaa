"""The NIC engine's per-packet work in C (fastpath.c), called through ctypes a run at a time.

* QpSender sends a run of one QP's packets (same opcode and length, consecutive PSNs) with one
  sendmmsg, from the QP's QpPackets templates (fabric_emu.wire.roce), ICRC included;
* Receiver reads a socket's packets in batches (recvmmsg, headers only) and returns them as
  records, consecutive in-order WRITE MIDDLE packets of one QP merged into one.

The library is compiled on first use with clang (a set-up dependency: it also builds the port
programs) and cached per source version under /var/lib/fabric-emu/nic/, as
fabric_emu.ports.datapath does for bpf/port.c. Python keeps every decision; C only moves bytes.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import struct
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

from fabric_emu.wire import roce
from fabric_emu.kernel.compiled import build_cached

SOURCE = Path(__file__).with_name("fastpath.c")
CACHE = Path("/var/lib/fabric-emu/nic")
HEADER_MAX = 28
MAX_TEMPLATES = 64  # per QP; a workload rarely has more than 4 (FIRST, MIDDLE, LAST, ONLY)
RX_RECORDS = 256  # records per receive call


class Template(ctypes.Structure):
    """struct fe_tmpl"""

    _fields_ = [("header", ctypes.c_uint8 * HEADER_MAX), ("header_len", ctypes.c_uint32),
                ("body_len", ctypes.c_uint32), ("crc", ctypes.c_uint32),
                ("ackreq_delta", ctypes.c_uint32), ("has_dma", ctypes.c_uint32),
                ("psn_tab", (ctypes.c_uint32 * 256) * 3), ("dma_tab", (ctypes.c_uint32 * 256) * 4)]


class RxRecord(ctypes.Structure):
    """struct fe_rx"""

    _fields_ = [("qpn", ctypes.c_uint32), ("psn", ctypes.c_uint32), ("count", ctypes.c_uint32),
                ("bytes", ctypes.c_uint32), ("aeth", ctypes.c_uint32), ("ce", ctypes.c_uint32),
                ("opcode", ctypes.c_uint8), ("ackreq", ctypes.c_uint8),
                ("malformed", ctypes.c_uint8), ("has_aeth", ctypes.c_uint8)]


# The same layout for struct.iter_unpack: reading records as tuples beats ctypes attributes.
_RX_LAYOUT = struct.Struct("=6I4B")
assert _RX_LAYOUT.size == ctypes.sizeof(RxRecord)


class SockaddrIn(ctypes.Structure):
    _fields_ = [("family", ctypes.c_uint16), ("port", ctypes.c_uint16),
                ("addr", ctypes.c_uint8 * 4), ("zero", ctypes.c_uint8 * 8)]


def build_library() -> Path:
    """The shared library for this version of fastpath.c (compiled on first use)."""
    return build_cached(SOURCE, CACHE, "fastpath", ".so", lambda out: [
        "clang", "-O2", "-Wall", "-Werror", "-shared", "-fPIC", str(SOURCE), "-o", str(out)])


@lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(build_library()))
    lib.fe_send_run.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32,
                                ctypes.c_uint32, ctypes.c_int, ctypes.c_uint32]
    lib.fe_send_run.restype = ctypes.c_int
    lib.fe_send_spray.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32,
                                  ctypes.c_uint32, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint32]
    lib.fe_send_spray.restype = ctypes.c_int
    lib.fe_recv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    lib.fe_recv.restype = ctypes.c_int
    return lib


def sockaddr(ip: str, port: int) -> SockaddrIn:
    a = SockaddrIn(socket.AF_INET, socket.htons(port))
    a.addr[:] = socket.inet_aton(ip)
    return a


def template(fields: roce.TemplateFields) -> Template:
    t = Template()
    if len(fields.header) > HEADER_MAX:
        raise ValueError(f"a {len(fields.header)} B header exceeds {HEADER_MAX} B")
    ctypes.memmove(t.header, fields.header, len(fields.header))
    t.header_len, t.body_len = len(fields.header), fields.body_len
    t.crc, t.ackreq_delta = fields.crc, fields.ackreq_delta
    for i, table in enumerate(fields.psn_tables):
        t.psn_tab[i][:] = table
    if fields.dma_tables is not None:
        t.has_dma = 1
        for i, table in enumerate(fields.dma_tables):
            t.dma_tab[i][:] = table
    return t


class QpSender:
    """Sends one QP's packets, a run per call: through its socket, or when spraying through its
    sockets in turn (one per UDP source port; packet PSN p through socket p mod their number)."""

    def __init__(self, packets: list[roce.QpPackets], socks: list[socket.socket], dst_ip: str):
        if len(packets) != len(socks) or len(socks) & (len(socks) - 1) or not socks:
            raise ValueError("one QpPackets per socket, and a power of two of sockets")
        self._lib = library()
        self._packets = packets
        self._fd = socks[0].fileno()
        self._fds = (ctypes.c_int * len(socks))(*(s.fileno() for s in socks))
        self._spray = len(socks) > 1
        self._addr = sockaddr(dst_ip, roce.ROCE_UDP_PORT)
        self._addr_p = ctypes.addressof(self._addr)
        # (opcode, data_len) -> (templates, the address to pass, UDP payload length); the entry
        # keeps the Template objects alive while C holds their addresses
        self._templates: dict[int, tuple[object, int, int]] = {}

    def send_run(self, opcode: int, psn: int, data_len: int, count: int, ackreq_last: bool,
                 message_len: int) -> tuple[int, int]:
        """Hand the kernel up to `count` packets; (packets taken, UDP payload bytes of each).

        Fewer than count (maybe 0) means the socket is full. Other socket errors raise OSError.
        """
        key = opcode << 32 | data_len
        t = self._templates.get(key)
        if t is None:
            t = self._add_template(key, opcode, data_len)
        if self._spray:
            n = self._lib.fe_send_spray(ctypes.addressof(self._fds), self._addr_p, t[1],
                                        len(self._fds), psn, count, ackreq_last, message_len)
        else:
            n = self._lib.fe_send_run(self._fd, self._addr_p, t[1], psn, count, ackreq_last,
                                      message_len)
        if n < 0:
            if -n in (errno.EAGAIN, errno.ENOBUFS):
                return 0, t[2]
            raise OSError(-n, os.strerror(-n))
        return n, t[2]

    def _add_template(self, key: int, opcode: int, data_len: int) -> tuple[object, int, int]:
        if len(self._templates) >= MAX_TEMPLATES:
            self._templates.clear()
        tmpls = [template(p.fields(opcode, data_len)) for p in self._packets]
        udp_len = roce.udp_payload_len(opcode, data_len)
        if self._spray:  # an array of the templates' addresses
            table = (ctypes.c_void_p * len(tmpls))(*(ctypes.addressof(t) for t in tmpls))
            entry = ((tmpls, table), ctypes.addressof(table), udp_len)
        else:
            entry = (tmpls, ctypes.addressof(tmpls[0]), udp_len)
        self._templates[key] = entry
        return entry


class Receiver:
    """Batched receive from one socket: records of (qpn, psn, count, bytes, aeth, ce, opcode,
    ackreq, malformed, has_aeth); see struct fe_rx in fastpath.c."""

    def __init__(self, sock: socket.socket):
        self._lib = library()
        self._fd = sock.fileno()
        self._records = (RxRecord * RX_RECORDS)()
        self._records_p = ctypes.addressof(self._records)
        self._view = memoryview(self._records).cast("B")
        self._packets = ctypes.c_uint32()
        self._packets_p = ctypes.addressof(self._packets)
        self.packets = 0  # datagrams read, in all

    def batches(self) -> Iterator[Iterator[tuple[int, ...]]]:
        """Batches of records until the socket is empty; a batch is valid until the next."""
        recv, size = self._lib.fe_recv, _RX_LAYOUT.size
        while True:
            n = recv(self._fd, self._records_p, RX_RECORDS, self._packets_p)
            if n < 0:
                raise OSError(-n, os.strerror(-n))
            self.packets += self._packets.value
            if n:
                yield _RX_LAYOUT.iter_unpack(self._view[:n * size])
            if n < RX_RECORDS:
                return
