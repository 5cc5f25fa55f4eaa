"""The layout of `struct port` and `struct event` in bpf/port.c, for reading and writing the
mmapped map from Python. Pure: tests/unit/test_lossless_logic.py checks it against the C source."""

from __future__ import annotations

import struct
from dataclasses import dataclass

NPRIO = 8
PORT_BYTES = 1112
MAX_PORTS = 4096
NO_PORT = 0xFFFF

PORT_SWITCH = 1
PORT_ECN = 2
PORT_PFC = 4
PORT_ORPHAN = 8  # kernel datapath: host frames leave their socket at the switch (port.c orphan())

EV_XOFF, EV_XON, EV_PFC_RX, EV_NIC_XOFF = 1, 2, 3, 4
EVENT = struct.Struct("=QIIIIQ")  # time_ns, type, port, quanta, vector, bytes

# (name, number of u64s), in declaration order
FIELDS: tuple[tuple[str, int], ...] = (
    ("flags", 1), ("limit", NPRIO), ("kmin", 1), ("kmax", 1), ("pmax32", 1),
    ("xoff", 1), ("xon", 1), ("headroom", 1),
    ("queue", NPRIO), ("held", NPRIO), ("xoff_state", 1),
    ("tx_packets", NPRIO), ("tx_bytes", NPRIO), ("drops", NPRIO), ("marked", NPRIO),
    ("max_queue", NPRIO), ("max_held", NPRIO),
    ("lossless_drops", 1), ("xoff_crossings", 1), ("xon_crossings", 1), ("headroom_overruns", 1),
    ("pause_tx", NPRIO), ("pause_rx", NPRIO), ("paused_ns", NPRIO), ("paused_since", NPRIO),
    ("events_lost", 1),
    ("wd_drop", 1), ("peer_wd_drop", 1), ("peer_stalled", 1), ("rx_lossless", 1), ("rx_wd_drops", 1), ("peer_drops", 1),
    ("wd_status", 1), ("wd_detected", 1), ("wd_restored", 1),
    ("nic_rx_rate", 1), ("nic_rx_limit", 1), ("nic_rx_xoff", 1), ("nic_rx_occ", 1), ("nic_rx_last", 1),
    ("nic_rx_state", 1), ("nic_rx_xoffs", 1), ("nic_rx_drops", 1), ("link_cut", 1), ("cut_drops", 1),
    ("handed_over", 1), ("handoff_charges", 1), ("ingress_charges", 1),
)


def _offsets() -> dict[str, tuple[int, int]]:
    out, at = {}, 0
    for name, n in FIELDS:
        out[name] = (at, n)
        at += n
    assert at * 8 == PORT_BYTES, f"struct port is {at * 8} bytes, not {PORT_BYTES}"
    return out


OFFSETS = _offsets()  # name -> (index of its first u64, count)

# Counters a reader takes, per priority or per port (config and state are not counters).
PER_PRIO_COUNTERS = ("tx_packets", "tx_bytes", "drops", "marked", "max_queue", "max_held",
                     "pause_tx", "pause_rx", "paused_ns")
PORT_COUNTERS = ("lossless_drops", "xoff_crossings", "xon_crossings", "headroom_overruns", "cut_drops")


@dataclass(frozen=True)
class Event:
    time_ns: int
    type: int
    port: int
    quanta: int
    vector: int
    bytes: int

    @classmethod
    def unpack(cls, raw: bytes) -> "Event":
        return cls(*EVENT.unpack_from(raw))


class PortTable:
    """Typed access to the mmapped `ports` array (a memoryview of u64s)."""

    def __init__(self, words: memoryview):
        self.words = words

    def _at(self, port: int, name: str, i: int = 0) -> int:
        first, n = OFFSETS[name]
        if not 0 <= i < n:
            raise IndexError(f"{name}[{i}]")
        return port * (PORT_BYTES // 8) + first + i

    def get(self, port: int, name: str, i: int = 0) -> int:
        return self.words[self._at(port, name, i)]

    def set(self, port: int, name: str, value: int, i: int = 0) -> None:
        self.words[self._at(port, name, i)] = value

    def add(self, port: int, name: str, value: int, i: int = 0) -> None:
        """Only for fields a single writer owns (the daemon's block)."""
        at = self._at(port, name, i)
        self.words[at] += value
