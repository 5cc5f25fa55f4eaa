"""The few bpf(2) calls fabric-emu needs, through ctypes: open pinned objects, update a hash
map, mmap an array map, and consume a ring buffer.

Loading is left to bpftool (`prog loadall ... pinmaps`), attaching tc filters to raw rtnetlink
(fabric_emu.kernel.rtnl: they take a program fd); a tracepoint program is attached here, by a
link this module pins. Reading counters goes through mmap: no system call per read, so a
sampler can read every port of a fabric many times a second.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import struct
from collections.abc import Iterator

_SYS_BPF = {"x86_64": 321, "aarch64": 280}[platform.machine()]
BPF_MAP_LOOKUP_ELEM = 1
BPF_MAP_UPDATE_ELEM = 2
BPF_MAP_GET_NEXT_KEY = 4
BPF_MAP_DELETE_ELEM = 3
BPF_OBJ_PIN = 6
BPF_OBJ_GET = 7
BPF_PROG_TEST_RUN = 10
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_RAW_TRACEPOINT_OPEN = 17

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _bpf(cmd: int, attr: bytes) -> int:
    buf = ctypes.create_string_buffer(attr, 128)
    ret = _libc.syscall(_SYS_BPF, cmd, buf, 128)
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"bpf({cmd}): {os.strerror(err)}")
    return ret


def obj_get(path: str) -> int:
    """An fd for a pinned program or map."""
    cpath = ctypes.create_string_buffer(path.encode())
    return _bpf(BPF_OBJ_GET, struct.pack("=QII", ctypes.addressof(cpath), 0, 0))


def obj_pin(fd: int, path: str) -> None:
    """Pin a program, map or link: it lives as long as the pin (or an open fd) does."""
    cpath = ctypes.create_string_buffer(path.encode())
    _bpf(BPF_OBJ_PIN, struct.pack("=QII", ctypes.addressof(cpath), fd, 0))


def raw_tracepoint_open(prog_fd: int) -> int:
    """Attach a BTF tracepoint program (tp_btf/<name>: the program names its tracepoint);
    returns the link's fd: the program stays attached while it, or a pin of it, lives."""
    return _bpf(BPF_RAW_TRACEPOINT_OPEN, struct.pack("=QI", 0, prog_fd))


def map_update(fd: int, key: bytes, value: bytes) -> None:
    k, v = ctypes.create_string_buffer(key), ctypes.create_string_buffer(value)
    _bpf(BPF_MAP_UPDATE_ELEM, struct.pack("=IIQQQ", fd, 0, ctypes.addressof(k), ctypes.addressof(v), 0))


def map_items(fd: int, key_size: int, value_size: int) -> Iterator[tuple[bytes, bytes]]:
    """Every (key, value) of a hash map, walked with BPF_MAP_GET_NEXT_KEY (a key deleted during
    the walk may restart it: fine for samplers, whose next sample sees the map again)."""
    cur, nxt = ctypes.create_string_buffer(key_size), ctypes.create_string_buffer(key_size)
    val = ctypes.create_string_buffer(value_size)
    first = True
    while True:
        try:
            _bpf(BPF_MAP_GET_NEXT_KEY, struct.pack("=IIQQQ", fd, 0, 0 if first else ctypes.addressof(cur),
                                                   ctypes.addressof(nxt), 0))
        except FileNotFoundError:
            return
        first = False
        ctypes.memmove(cur, nxt, key_size)
        try:
            _bpf(BPF_MAP_LOOKUP_ELEM, struct.pack("=IIQQQ", fd, 0, ctypes.addressof(cur), ctypes.addressof(val), 0))
        except FileNotFoundError:
            continue  # deleted since
        yield cur.raw, val.raw


def map_delete(fd: int, key: bytes) -> None:
    k = ctypes.create_string_buffer(key)
    _bpf(BPF_MAP_DELETE_ELEM, struct.pack("=IIQQQ", fd, 0, ctypes.addressof(k), 0, 0))


def prog_test_run(fd: int, packet: bytes) -> tuple[int, bytes]:
    """Run a loaded program once on a packet (BPF_PROG_TEST_RUN): (its return code, the packet
    as the program left it). Tests drive the port programs' logic with it, no network needed."""
    data_in = ctypes.create_string_buffer(packet, len(packet))
    data_out = ctypes.create_string_buffer(len(packet) + 256)
    attr = ctypes.create_string_buffer(struct.pack("=IIIIQQII", fd, 0, len(packet), len(data_out),
                                                   ctypes.addressof(data_in), ctypes.addressof(data_out),
                                                   1, 0), 128)
    if _libc.syscall(_SYS_BPF, BPF_PROG_TEST_RUN, attr, 128) < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"bpf(BPF_PROG_TEST_RUN): {os.strerror(err)}")
    _, retval, _, size_out = struct.unpack_from("=IIII", attr.raw)
    return retval, data_out.raw[:size_out]


def map_info(fd: int) -> tuple[int, int, int, int]:
    """(type, key_size, value_size, max_entries) of a map."""
    info = ctypes.create_string_buffer(80)
    _bpf(BPF_OBJ_GET_INFO_BY_FD, struct.pack("=IIQ", fd, 80, ctypes.addressof(info)))
    return struct.unpack_from("=IIIII", info.raw)[0:1] + struct.unpack_from("=III", info.raw, 8)


def mmap_array(fd: int) -> mmap.mmap:
    """Map a BPF_F_MMAPABLE array map read-write; its values are laid end to end."""
    _, _, value_size, entries = map_info(fd)
    length = -(-value_size * entries // mmap.PAGESIZE) * mmap.PAGESIZE
    return mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)


_RB_BUSY = 1 << 31
_RB_DISCARD = 1 << 30
_RB_HDR = 8


class RingBuffer:
    """Consumer side of a BPF_MAP_TYPE_RINGBUF (the layout of kernel/bpf/ringbuf.c): a
    consumer-position page we write, then the producer-position page and the data area mapped
    twice in a row, so a record that wraps can be read in one slice."""

    def __init__(self, fd: int):
        self.fd = fd
        _, _, _, size = map_info(fd)
        self.mask = size - 1
        page = mmap.PAGESIZE
        self._cons = mmap.mmap(fd, page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
        self._prod = mmap.mmap(fd, page + 2 * size, mmap.MAP_SHARED, mmap.PROT_READ, offset=page)
        self._data = memoryview(self._prod)[page:]
        self._page = page

    def records(self) -> Iterator[bytes]:
        """Every committed record not yet consumed; the position advances as they are taken."""
        cons = struct.unpack_from("=Q", self._cons, 0)[0]
        prod = struct.unpack_from("=Q", self._prod, 0)[0]
        while cons < prod:
            off = cons & self.mask
            header = struct.unpack_from("=I", self._data, off)[0]
            if header & _RB_BUSY:
                break
            length = header & ~(_RB_BUSY | _RB_DISCARD)
            if not header & _RB_DISCARD:
                yield bytes(self._data[off + _RB_HDR:off + _RB_HDR + length])
            cons += (length + _RB_HDR + 7) & ~7
            struct.pack_into("=Q", self._cons, 0, cons)

    def close(self) -> None:
        self._data.release()
        self._prod.close()
        self._cons.close()
