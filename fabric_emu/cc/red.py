"""The ECN marking profile switches use for RoCE (DCQCN's "RED on the instantaneous queue").

No marks up to kmin, a probability rising linearly to pmax at kmax, every ECT packet above kmax
(docs/reference/protocol_facts.md §2.2). The BPF program computes the same thing in integers;
this is the reference the tests compare it with.
"""

from __future__ import annotations

PMAX_SCALE = 1 << 32  # the BPF program compares pmax * 2^32 with a random u32


def mark_probability(depth: int, kmin: int, kmax: int, pmax: float) -> float:
    """Probability that an ECT packet arriving to a queue of `depth` bytes is marked CE."""
    if depth <= kmin:
        return 0.0
    if depth > kmax:
        return 1.0
    return pmax * (depth - kmin) / (kmax - kmin)


def pmax_scaled(pmax: float) -> int:
    """pmax as the BPF program takes it (at most 2^32, i.e. always)."""
    return min(PMAX_SCALE, round(pmax * PMAX_SCALE))
