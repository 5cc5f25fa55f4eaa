"""The PFC watchdog of one lossless queue, pure: SONiC's detection and restoration rules
(docs/reference/pfc_failure_modes.md §1.2-1.4), polled with samples in modelled nanoseconds.

A poll is stormy when the queue was paused at this sample and the one before, pause frames
arrived in between, and it never went from running to paused in between (the current
Broadcom/VS rule: "paused continuously"). Each stormy poll charges one poll interval, as SONiC's
classic plugin does (a poll a little early still counts whole, an emulator that stalled does not
detect sooner); a clean poll resets the detection timer. Detected when it runs out, so at least two samples agree and
the latency after the queue became continuously paused lies between detection and detection +
poll. Restored (drop, forward) once no pause frame arrived for the restoration time, each new
frame resetting it; alert restores at the first poll that is not stormy. The state lives here,
not in the daemon, so a deadlock detector can read every queue's.
"""

from __future__ import annotations

from dataclasses import dataclass

ACTIONS = ("drop", "forward", "alert")


@dataclass(frozen=True)
class Timers:
    """Modelled nanoseconds."""

    detection_ns: int
    restoration_ns: int
    poll_ns: int
    action: str = "drop"

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"action must be one of {', '.join(ACTIONS)}")
        if not 0 < self.poll_ns <= self.detection_ns <= self.restoration_ns:
            raise ValueError("need 0 < poll <= detection <= restoration")


@dataclass(frozen=True)
class Sample:
    t_ns: int  # modelled time
    paused: bool  # the queue's pause state as its received pause frames set it
    pause_rx: int  # pause frames received so far
    on2off: int  # times it went from running to paused so far


@dataclass
class QueueWatchdog:
    timers: Timers
    status: str = "operational"  # or "stormed"
    prev: Sample | None = None
    detect_left_ns: int = 0
    restore_left_ns: int = 0

    def __post_init__(self) -> None:
        self.detect_left_ns = self.timers.detection_ns

    def _stormy(self, s: Sample) -> bool:
        p = self.prev
        return (p is not None and p.paused and s.paused and s.pause_rx > p.pause_rx
                and s.on2off == p.on2off)

    def poll(self, s: Sample) -> str | None:
        """Take one sample; returns "storm", "restore" or None."""
        prev, stormy = self.prev, self._stormy(s)
        charge = self.timers.poll_ns
        self.prev = s
        if prev is None:  # the first sample is only a baseline
            return None
        if self.status == "operational":
            self.detect_left_ns = self.detect_left_ns - charge if stormy else self.timers.detection_ns
            if self.detect_left_ns <= 0:
                self.status = "stormed"
                self.restore_left_ns = self.timers.restoration_ns
                return "storm"
            return None
        if self.timers.action == "alert":
            restored = not stormy
        else:
            self.restore_left_ns = (self.timers.restoration_ns if s.pause_rx > prev.pause_rx
                                    else self.restore_left_ns - charge)
            restored = self.restore_left_ns <= 0
        if restored:
            self.status = "operational"
            self.detect_left_ns = self.timers.detection_ns
            return "restore"
        return None
