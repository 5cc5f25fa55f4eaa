"""Lossless bytes charged to an ingress port for frames Open vSwitch then lost, given back.

A lossless frame is charged to the switch port it enters by in that port's tc ingress hook,
before Open vSwitch reads it; it is credited back when an egress port drops it or when it
arrives at the far end. A frame OVS itself loses in between (a full packet socket, a TTL-expiry
or table-miss drop) reaches no egress, so its bytes would stay charged for good: the port
would sit nearer its XOFF threshold, or above XON, pausing its upstream for ever (a deadlock
the emulator made). The egress programs also count every admitted frame per (ingress, egress)
port in `pair_held` (fabric_emu.ports.datapath.PortMaps.pairs), so

    held[in] - sum over out of pair_held[in, out] = bytes inside OVS now + bytes OVS lost.

A frame spends microseconds inside OVS, so once neither side has moved for QUIET_S the
difference is all lost, and LeakCheck says to credit it (the PFC daemon does, atomically, and
its reconcile sends the XON that follows). While a port's bytes move, nothing is decided: a
leak waits for the port's next quiet moment, which a paused port reaches at once.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import dataclass

QUIET_S = 1.0  # wall seconds neither held nor pair_held of a port changed (OVS holds a frame for us)
POLL_S = 0.25  # how often the PFC daemon looks


@dataclass
class _Still:
    held: int
    held_since: float
    admitted: int | None = None
    admitted_since: float = 0.0


class LeakCheck:
    """Pure: fed each poll's held bytes per ingress port (and, for the candidates, the bytes of
    theirs the egress ports hold), says what to credit back per port, each leak once."""

    def __init__(self, quiet_s: float = QUIET_S):
        self.quiet_s = quiet_s
        self._still: dict[int, _Still] = {}
        self.credited: dict[int, int] = {}  # port -> bytes given back over the run

    def candidates(self, held: dict[int, int], now: float) -> list[int]:
        """Ports holding bytes that stood still for half the quiet time: only these need
        pair_held, whose reading costs a syscall per entry."""
        return [p for p, h in held.items() if h and (s := self._still.get(p)) is not None
                and s.held == h and now - s.held_since >= self.quiet_s / 2]

    def poll(self, now: float, held: dict[int, int], admitted: dict[int, int]) -> dict[int, int]:
        out = {}
        for port, h in held.items():
            s = self._still.get(port)
            if s is None or s.held != h:
                self._still[port] = _Still(h, now)
                continue
            a = admitted.get(port)
            if a is None:
                continue
            if s.admitted != a:
                s.admitted, s.admitted_since = a, now
                continue
            if h > a and now - max(s.held_since, s.admitted_since) >= self.quiet_s:
                out[port] = h - a
                self.credited[port] = self.credited.get(port, 0) + h - a
                del self._still[port]
        return out


class Atomics:
    """Atomic subtract and compare-and-swap on the mmapped ports array, as the BPF programs do
    theirs (lock-prefixed instructions, through libatomic): a plain read-modify-write from
    Python could undo a program's update landing in between."""

    def __init__(self) -> None:
        lib = ctypes.CDLL(ctypes.util.find_library("atomic") or "libatomic.so.1")
        # getattr: a name starting with two underscores would be mangled inside a class
        self._sub = getattr(lib, "__atomic_fetch_sub_8")
        self._sub.argtypes = (ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int)
        self._sub.restype = ctypes.c_uint64
        self._cas = getattr(lib, "__atomic_compare_exchange_8")
        self._cas.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_bool,
                              ctypes.c_int, ctypes.c_int)
        self._cas.restype = ctypes.c_bool

    SEQ_CST = 5

    def fetch_sub(self, address: int, value: int) -> int:
        return self._sub(address, value, self.SEQ_CST)

    def compare_and_swap(self, address: int, expected: int, new: int) -> bool:
        want = ctypes.c_uint64(expected)
        return self._cas(address, ctypes.byref(want), new, False, self.SEQ_CST, self.SEQ_CST)
