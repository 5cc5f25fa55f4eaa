"""The PFC watchdog of a run's switch ports, as the PFC daemon runs it: one QueueWatchdog
(fabric_emu.cc.pfcwd) per switch port's lossless queue, sampled every poll, with SONiC's
counters and an episode log. The daemon feeds it pause frames and gate changes and carries out
what it decides (fabric_emu.ports.pfcd); it reads the ports map only for packet counts.

Each switch polls on its own timer, as each switch's orchagent does: its phase within the poll
interval, counted from the start of traffic, comes from the run's seed and the switch's name
(poll_phase), so runs repeat and no two switches are artificially in step. Whether an upstream queue, paused a few microseconds after
the stormed one, is detected too depends on where its switch's polls fall, as in a real fabric.

Counters are SONiC's (PFC_WD_QUEUE_STATS_*): TX/RX packets and drops of the queue counted only
while it is stormed, and _LAST for the latest storm; like SONiC's, `alert` counts none.
"""

from __future__ import annotations

import os
import sys
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from fabric_emu.cc.pfcwd import QueueWatchdog, Sample, Timers
from fabric_emu.ports.layout import PortTable

LOSSLESS = 3
STATUS_FIELDS = ("wd_status", "wd_detected", "wd_restored")  # the watchdog's live words in the ports map
STATS = ("TX_PACKETS", "TX_DROPPED_PACKETS", "RX_PACKETS", "RX_DROPPED_PACKETS")
PREFIX = "PFC_WD_QUEUE_STATS_"
TRACE = bool(os.environ.get("FABRIC_EMU_WD_TRACE"))  # every poll of a paused queue, to logs/pfcd.log


@dataclass
class QueueBook:
    """What the watchdog knows of one queue besides its state machine."""

    intf: str
    wd: QueueWatchdog
    pause_rx: int = 0  # pause frames received
    on2off: int = 0  # running -> paused transitions
    paused: bool = False
    paused_since: float | None = None  # monotonic s of the last running -> paused
    last_pause: float | None = None  # monotonic s of the last pause frame received
    base: dict[str, int] = field(default_factory=dict)  # packet counts when the storm began
    counters: dict[str, int] = field(default_factory=lambda: {
        **{f"{PREFIX}DEADLOCK_DETECTED": 0, f"{PREFIX}DEADLOCK_RESTORED": 0},
        **{f"{PREFIX}{k}": 0 for k in STATS}, **{f"{PREFIX}{k}_LAST": 0 for k in STATS}})
    episode: dict | None = None  # the storm in progress


def clear_status(table: PortTable, port_ids: Iterable[int]) -> None:
    """Zero the watchdog's live words of these ports. Its counts are one daemon's, and a lab
    starts a fresh daemon per run on the same map: a previous run's storms must not be read as
    this run's (live views count them from here; traffic starts after)."""
    for pid in port_ids:
        for name in STATUS_FIELDS:
            table.set(pid, name, 0)


def poll_phase(seed: int, switch: str) -> float:
    """Where in the poll interval a switch's polls fall, as a fraction in [0, 1)."""
    return zlib.crc32(f"{seed}:{switch}".encode()) % 1000 / 1000


class PortWatchdogs:
    def __init__(self, timers: Timers, ports: dict[int, tuple[str, str]], table: PortTable, dilation: float,
                 seed: int = 0):
        """ports: port id -> (interface, switch) of each watched queue."""
        self.timers, self.table, self.dilation = timers, table, dilation
        self.queues = {pid: QueueBook(intf, QueueWatchdog(timers)) for pid, (intf, _) in ports.items()}
        self.by_switch: dict[str, list[int]] = {}
        for pid, (_, switch) in ports.items():
            self.by_switch.setdefault(switch, []).append(pid)
        self.phase = {sw: poll_phase(seed, sw) for sw in self.by_switch}
        self.next_at: dict[str, float] = {}  # wall (monotonic) time of each switch's next poll
        self.episodes: list[dict] = []
        self.polls = 0

    @property
    def poll_wall_s(self) -> float:
        return self.timers.poll_ns / 1e9 * self.dilation

    def next_poll(self) -> float | None:
        return min(self.next_at.values(), default=None)

    def anchor(self, now: float) -> None:
        """Each switch's polls from now on fall at its phase after `now` (the start of traffic),
        so a run repeats where its polls fall."""
        step = self.poll_wall_s
        self.next_at = {sw: now + self.phase[sw] * step for sw in self.by_switch}

    def due(self, now: float) -> list[tuple[int, str]]:
        """Poll every switch whose time has come (the first call anchors, if nothing did)."""
        step = self.poll_wall_s
        if not self.next_at:
            self.anchor(now)
        changed = []
        for sw, at in self.next_at.items():
            if now < at:
                continue
            changed += self.poll(now, self.by_switch[sw])
            late = int((now - at) // step) + 1  # keep the phase, skipping polls a stall missed
            self.next_at[sw] = at + late * step
        return changed

    # ------------------------------------------------------------------ what the daemon sees
    def on_pause_frame(self, port: int, now: float) -> None:
        q = self.queues.get(port)
        if q is not None:
            q.pause_rx += 1
            q.last_pause = now

    def on_gate(self, port: int, paused: bool, now: float) -> None:
        """The queue's pause state as its pause frames set it (not as a mitigation left it)."""
        q = self.queues.get(port)
        if q is None or q.paused == paused:
            return
        q.paused = paused
        if paused:
            q.on2off += 1
            q.paused_since = now

    def stormed(self, port: int) -> bool:
        q = self.queues.get(port)
        return q is not None and q.wd.status == "stormed"

    # ------------------------------------------------------------------ polling
    def poll(self, now: float, ports: list[int] | None = None) -> list[tuple[int, str]]:
        """Sample the queues of `ports` (default: all); returns (port, "storm" | "restore") for
        each that changed."""
        self.polls += 1
        t_ns = int(now * 1e9 / self.dilation)
        changed = []
        for pid in self.queues if ports is None else ports:
            q = self.queues[pid]
            what = q.wd.poll(Sample(t_ns, q.paused, q.pause_rx, q.on2off))
            if TRACE and (q.paused or what or q.wd.status != "operational"):
                print(f"wd {now:.6f} {q.intf} paused={q.paused} rx={q.pause_rx} on2off={q.on2off} "
                      f"left={q.wd.detect_left_ns} {q.wd.status} {what}", file=sys.stderr, flush=True)
            if what == "storm":
                self._storm(pid, q, now)
            elif what == "restore":
                self._restore(pid, q, now)
            if what:
                changed.append((pid, what))
        return changed

    def _counts(self, pid: int) -> dict[str, int]:
        t = self.table
        return {"TX_PACKETS": t.get(pid, "tx_packets", LOSSLESS), "TX_DROPPED_PACKETS": t.get(pid, "drops", LOSSLESS),
                "RX_PACKETS": t.get(pid, "rx_lossless"), "RX_DROPPED_PACKETS": t.get(pid, "rx_wd_drops")}

    def _storm(self, pid: int, q: QueueBook, now: float) -> None:
        q.counters[f"{PREFIX}DEADLOCK_DETECTED"] += 1
        for k in STATS:
            q.counters[f"{PREFIX}{k}_LAST"] = 0
        q.base = self._counts(pid)
        q.episode = {"intf": q.intf, "queue": LOSSLESS, "action": self.timers.action,
                     "paused_since_s": q.paused_since, "detected_s": now, "last_pause_s": q.last_pause,
                     "restored_s": None}
        self.episodes.append(q.episode)
        self.table.set(pid, "wd_status", 1)
        self.table.set(pid, "wd_detected", q.counters[f"{PREFIX}DEADLOCK_DETECTED"])

    def _settle(self, pid: int, q: QueueBook) -> None:
        """Bring the storm's packet counts up to now (at restore, and at the end of a run)."""
        if q.episode is None or self.timers.action == "alert":
            return
        now_counts = self._counts(pid)
        for k in STATS:
            delta = now_counts[k] - q.base.get(k, now_counts[k])
            q.counters[f"{PREFIX}{k}"] += delta
            q.counters[f"{PREFIX}{k}_LAST"] += delta
            q.episode[k.lower()] = q.counters[f"{PREFIX}{k}_LAST"]
        q.base = now_counts

    def _restore(self, pid: int, q: QueueBook, now: float) -> None:
        self._settle(pid, q)
        q.counters[f"{PREFIX}DEADLOCK_RESTORED"] += 1
        if q.episode is not None:
            q.episode.update(restored_s=now, last_pause_s=q.last_pause)
            q.episode = None
        self.table.set(pid, "wd_status", 0)
        self.table.set(pid, "wd_restored", q.counters[f"{PREFIX}DEADLOCK_RESTORED"])

    # ------------------------------------------------------------------ end
    def report(self) -> dict:
        for pid, q in self.queues.items():
            self._settle(pid, q)
            if q.episode is not None:
                q.episode["last_pause_s"] = q.last_pause
        return {"action": self.timers.action, "detection_ns": self.timers.detection_ns,
                "restoration_ns": self.timers.restoration_ns, "poll_ns": self.timers.poll_ns,
                "polls": self.polls, "episodes": self.episodes,
                "queues": {q.intf: {"status": q.wd.status, "pause_rx": q.pause_rx, **q.counters}
                           for q in self.queues.values()}}
