"""The DLB (flowlet switching) stage's table, struct dlb_leaf in bpf/port.c, from userspace.

One entry per leaf number (the third byte of its hosts' addresses): the controller writes the
config (enabled, inactivity, quality window, uplinks, which uplinks reach which leaf) and reads
the counters (flowlets started and moves, per uplink). The array is mmapped, so a write is a
store, as fabric_emu.ports.layout does for the port table.
"""

from __future__ import annotations

import os
from pathlib import Path

from fabric_emu.kernel import bpfsys

MAX_LEAVES = 256
MAX_UPLINKS = 16
TTL_BASE = 192  # the IP TTL that carries uplink index i is TTL_BASE + i
ROCE_PORT = 4791

# struct dlb_leaf, in 64-bit words
_FIELDS: list[tuple[str, int]] = [
    ("enabled", 1), ("inactivity_ns", 1), ("window_ns", 1), ("n_uplinks", 1),
    ("allowed", MAX_LEAVES), ("window_start", 1),
    ("bytes_cur", MAX_UPLINKS), ("bytes_prev", MAX_UPLINKS),
    ("flowlets", MAX_UPLINKS), ("moves", MAX_UPLINKS), ("packets", MAX_UPLINKS), ("bytes", MAX_UPLINKS),
    ("next_start", 1),
]
OFFSET: dict[str, int] = {}
_at = 0
for _name, _n in _FIELDS:
    OFFSET[_name] = _at
    _at += _n
WORDS = _at  # 358 words, 2864 bytes
COUNTERS = ("flowlets", "moves", "packets", "bytes")


class DlbTable:
    """The dlb map of one run (pinned under <pins>/maps/dlb)."""

    def __init__(self, words: memoryview):
        self.words = words

    @classmethod
    def open(cls, pins: Path) -> "DlbTable":
        fd = bpfsys.obj_get(str(pins / "maps" / "dlb"))
        try:
            mem = bpfsys.mmap_array(fd)
        finally:
            os.close(fd)
        return cls(memoryview(mem).cast("Q"))

    def _at(self, leaf: int, field: str, i: int = 0) -> int:
        if not 0 <= leaf < MAX_LEAVES:
            raise ValueError(f"leaf number {leaf} outside 0..{MAX_LEAVES - 1}")
        return leaf * WORDS + OFFSET[field] + i

    def configure(self, leaf: int, *, inactivity_ns: int, window_ns: int, n_uplinks: int,
                  allowed: dict[int, int]) -> None:
        """Set a leaf's stage up (still disabled): allowed maps destination leaf -> bitmask of
        the uplink indexes that reach it."""
        if not 0 < n_uplinks <= MAX_UPLINKS:
            raise ValueError(f"DLB handles 1..{MAX_UPLINKS} uplinks, got {n_uplinks}")
        w = self.words
        w[self._at(leaf, "inactivity_ns")] = inactivity_ns
        w[self._at(leaf, "window_ns")] = window_ns
        w[self._at(leaf, "n_uplinks")] = n_uplinks
        self.set_allowed(leaf, allowed)

    def set_allowed(self, leaf: int, allowed: dict[int, int]) -> None:
        for dest in range(MAX_LEAVES):
            self.words[self._at(leaf, "allowed", dest)] = allowed.get(dest, 0)

    def set_timing(self, leaf: int, *, inactivity_ns: int | None = None, window_ns: int | None = None) -> None:
        """Change the flowlet gap or the quality window (live: the next packet uses them)."""
        if inactivity_ns is not None:
            self.words[self._at(leaf, "inactivity_ns")] = inactivity_ns
        if window_ns is not None:
            self.words[self._at(leaf, "window_ns")] = window_ns

    def enable(self, leaf: int, on: bool) -> None:
        self.words[self._at(leaf, "enabled")] = int(on)

    def counters(self, leaf: int, n_uplinks: int) -> dict[str, list[int]]:
        return {c: [self.words[self._at(leaf, c, i)] for i in range(n_uplinks)] for c in COUNTERS}

    def close(self) -> None:
        self.words.release()
