"""A live progress bar for long runs: bytes delivered so far, emulated time elapsed, and the
time the workload takes at line rate (with the modelled fabric times beside them).

The delivered count is the switches' egress toward the hosts, read from the port programs'
map twice a second (LosslessPorts.to_hosts), less the RoCE headers of each packet: an estimate
of the payload, which the bar compares with what the workload will deliver in all. Shown only
on a terminal, and only when the workload takes LONG_RUN_S or more of emulated time; a run
started from Python (fabric_emu.api) can instead be told the same figures, as ProgressEvents.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn

from fabric_emu.wire.roce import BTH_LEN, FRAME_OVERHEAD, ICRC_LEN
from fabric_emu.measure.sampling import Sampler

LONG_RUN_S = 5.0  # emulated seconds at line rate from which a run shows the bar
DATA_OVERHEAD = FRAME_OVERHEAD + BTH_LEN + ICRC_LEN  # bytes of a data packet that are not payload


@dataclass(frozen=True)
class ProgressEvent:
    """Where a run is: its phase (measure, bring_up, traffic, tear_down, results, done), the
    fraction of the workload's payload delivered (traffic only, an estimate; else None), the
    wall-clock seconds since the run began, and a line of text for people."""
    phase: str
    fraction: float | None
    elapsed_s: float
    text: str


OnProgress = Callable[[ProgressEvent], None]


def payload_estimate(wire_bytes: int, packets: int) -> int:
    """Payload in what the switches sent: each packet less its headers (an ACK counts ~0)."""
    return max(0, wire_bytes - packets * DATA_OVERHEAD)


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def progress_text(delivered: int, planned: int, elapsed_s: float | None, line_rate_s: float,
                  dilation: float) -> str:
    """'12.0 MB of 224.0 MB delivered, 3.1 s of 9.0 s at line rate (fabric 775 of 2,240 us)'."""
    volume = f"{_mb(delivered)} of {_mb(planned)} delivered"
    if elapsed_s is None:
        return f"{volume}, starting"
    return (f"{volume}, {elapsed_s:.1f} s of {line_rate_s:.1f} s at line rate "
            f"(fabric {elapsed_s / dilation * 1e6:,.0f} of {line_rate_s / dilation * 1e6:,.0f} us)")


class RunProgress(Sampler):
    """The bar, updated by the sampler thread; a no-op when not `shown`. `start(go)` is told the
    wall-clock time the NICs start sending."""

    interval_s = 0.5

    def __init__(self, console: Console, to_hosts: Callable[[], tuple[int, int]], planned: int,
                 line_rate_s: float, dilation: float, shown: bool | None = None,
                 on_update: Callable[[float, str], None] | None = None) -> None:
        self.console = console
        self.to_hosts = to_hosts
        self.planned = planned
        self.line_rate_s = line_rate_s
        self.dilation = dilation
        self.shown = (console.is_terminal and line_rate_s >= LONG_RUN_S) if shown is None else shown
        self.on_update = on_update  # told (fraction delivered, text) at every tick, bar or not
        self._go: float | None = None
        self._bar: Progress | None = None
        self._base = (0, 0)

    def start(self, go: float) -> None:
        self._go = go

    def __enter__(self) -> RunProgress:
        if not self.shown and self.on_update is None:
            return self
        self._base = self.to_hosts()  # what crossed before the traffic phase is not the workload's
        if self.on_update is not None and not self.shown:
            return super().__enter__()
        self._bar = Progress(TextColumn("traffic"), BarColumn(), TextColumn("{task.fields[text]}"),
                             console=self.console, transient=True, auto_refresh=False)
        self._task = self._bar.add_task("traffic", total=max(1, self.planned), text="")
        self._bar.start()
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        if self._bar is None and self.on_update is None:
            return
        super().__exit__(*exc)
        if self._bar is not None:
            self._bar.stop()

    def ticks(self) -> Iterator[None]:
        while True:
            yield
            wire, packets = self.to_hosts()
            delivered = min(self.planned, payload_estimate(wire - self._base[0], packets - self._base[1]))
            elapsed = None if self._go is None or time.time() < self._go else time.time() - self._go
            text = progress_text(delivered, self.planned, elapsed, self.line_rate_s, self.dilation)
            if self._bar is not None:
                self._bar.update(self._task, completed=delivered, refresh=True, text=text)
            if self.on_update is not None:
                self.on_update(delivered / max(1, self.planned), text)
