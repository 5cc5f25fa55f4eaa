"""Samples the lossless buffers' waits while traffic runs, for the PFC deadlock detector
(fabric_emu.cc.deadlock): which bytes each switch holds for which egress, and which egresses
are paused. Reading them costs a few microseconds of mmap and one bpf(2) call per held pair."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from fabric_emu.cc.deadlock import DeadlockTracker
from fabric_emu.measure.sampling import Sampler

Waits = tuple[dict[tuple[str, str, str], int], set[tuple[str, str]]]


class DeadlockSampler(Sampler):
    """Keeps (monotonic time, held, paused) at every tick (held is empty while nothing is
    paused: there can be no cycle then)."""

    def __init__(self, waits: Callable[[], Waits], interval_s: float = 0.1) -> None:
        self.waits = waits
        self.interval_s = interval_s
        self.samples: list[tuple[float, dict, set]] = []

    def ticks(self) -> Iterator[None]:
        while True:
            yield
            held, paused = self.waits()
            self.samples.append((time.monotonic(), held, paused))


def track(samples: list[tuple[float, dict, set]], go_monotonic: float, dilation: float,
          min_duration_s: float, switches: list[str]) -> DeadlockTracker:
    """The tracker over the samples taken from GO on, in modelled seconds since GO."""
    tracker = DeadlockTracker(min_duration_s)
    t = 0.0
    for mono, held, paused in samples:
        if mono < go_monotonic:
            continue
        t = (mono - go_monotonic) / dilation
        tracker.sample(t, held, paused, switches)
    tracker.finish(t)
    return tracker
