"""The PFC daemon's late pauses, each with what the daemon was doing meanwhile.

A pause is late when more than LATE_NS passed between the byte that crossed xoff (in the
kernel) and the upstream gate closed. Its stages (fabric_emu.ports.pfcd.split_reaction) say
where the time went; the daemon's own long calls overlapping it (a frame send, a tc change, a
round of its loop) say whether the daemon was busy in a syscall then, or was waiting and woke
late. Each keeps the crossing's CLOCK_MONOTONIC stamp, so a trace taken beside the run (the
per-CPU stalls of benchmarks/pause_load.py --probe) lines up with it. Pure bookkeeping: nothing
here runs per packet, a call adds one comparison.
"""

from __future__ import annotations

from collections import deque

LATE_NS = 1_000_000  # issue 20's bar: a pause slower than 1 ms
LONG_CALL_NS = 300_000  # the daemon's calls worth keeping: longer than a typical pause
KEPT = 10  # the slowest late pauses a report keeps
CALLS_KEPT = 256  # recent long calls, enough to cover any pause kept


class LatePauses:
    def __init__(self) -> None:
        self.calls: deque[tuple[str, int, int]] = deque(maxlen=CALLS_KEPT)
        self.count = 0
        self.slowest: list[dict] = []
        self.pending: list[tuple[int, int, dict[str, float]]] = []  # late, their round not over yet

    def call(self, kind: str, start_ns: int, end_ns: int) -> None:
        """One call of the daemon's: "frame", "kick", "gate", or "loop" (a round's work, recorded
        as it ends: the pauses it closed are complete then, every call that overlapped them
        included)."""
        if end_ns - start_ns > LONG_CALL_NS:
            self.calls.append((kind, start_ns, end_ns))
        if kind == "loop" and self.pending:
            self._settle()

    def pause(self, crossed_ns: int, closed_ns: int, split: dict[str, float]) -> None:
        """A pause that took effect, from its xoff crossing to its gate closed: kept if late."""
        if closed_ns - crossed_ns > LATE_NS:
            self.count += 1
            self.pending.append((crossed_ns, closed_ns, split))

    def _settle(self) -> None:
        for crossed_ns, closed_ns, split in self.pending:
            entry = {"at_monotonic_ns": crossed_ns, "ms": round((closed_ns - crossed_ns) / 1e6, 3),
                     "stages_ms": {k.removesuffix("_s"): round(v * 1e3, 3) for k, v in split.items()
                                   if k != "total_s" and v},
                     # the daemon's long calls meanwhile, start and end in ms from the crossing
                     "daemon_ms": [[kind, round((s - crossed_ns) / 1e6, 3), round((e - crossed_ns) / 1e6, 3)]
                                   for kind, s, e in sorted(self.calls, key=lambda c: c[1])
                                   if e > crossed_ns and s < closed_ns]}
            self.slowest = slowest_first(self.slowest + [entry])
        self.pending.clear()

    def report(self) -> dict:
        self._settle()
        return {"count": self.count, "slowest": self.slowest}


def slowest_first(entries: list[dict]) -> list[dict]:
    return sorted(entries, key=lambda e: -e["ms"])[:KEPT]


def merge(parts: list[dict]) -> dict | None:
    """The reports of several daemons (a fabric over several machines) as one."""
    found = [p["late_pauses"] for p in parts if p.get("late_pauses")]
    if not found:
        return None
    return {"count": sum(f["count"] for f in found), "slowest": slowest_first([e for f in found for e in f["slowest"]])}
