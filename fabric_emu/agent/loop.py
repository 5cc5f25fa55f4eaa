"""The agent's clock and its single-threaded event loop: receive, advance, send, sleep."""

from __future__ import annotations

import ctypes
import time
from typing import Protocol

from fabric_emu.agent.nic import Nic

IDLE_POLL_S = 0.05  # longest sleep, so a stop request or the deadline is noticed quickly
PR_SET_TIMERSLACK = 29
TIMER_SLACK_NS = 1000

# Epoch seconds on the monotonic clock: comparable across agents, immune to clock steps.
_EPOCH_OFFSET = time.time() - time.monotonic()


def now() -> float:
    return time.monotonic() + _EPOCH_OFFSET


class Driver(Protocol):
    """A workload: posts messages on the NIC as its progress allows."""

    @property
    def finished(self) -> bool: ...

    @property
    def wake_at(self) -> float | None:
        """When the driver must act by the clock alone (a flow's start time), if ever."""

    def advance(self, now: float) -> None: ...


class Stopped(Protocol):
    def __bool__(self) -> bool: ...


def run_loop(driver: Driver, nic: Nic, stop: Stopped, deadline: float) -> bool:
    """Run until the driver finishes (True), or a stop request or the deadline (False)."""
    _reduce_timer_slack()
    readable = True
    while True:
        t = now()
        if stop or t >= deadline:
            return False
        if readable:
            nic.receive(t)
        driver.advance(t)
        if driver.finished:
            return True
        wake = nic.transmit(t)
        driver.advance(now())  # a step's last packet may have just left
        if wake is None and not nic.idle:  # advance() posted more work
            readable = False
            continue
        sleep = IDLE_POLL_S if wake is None else min(wake - now(), IDLE_POLL_S)
        due = driver.wake_at
        if due is not None:
            sleep = min(sleep, due - now())
        readable = nic.wait(min(sleep, deadline - t))


def _reduce_timer_slack() -> None:
    """Ask for 1 us timer slack (default 50 us): pacing sleeps are often shorter than 50 us."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, TIMER_SLACK_NS, 0, 0, 0)
    except (OSError, AttributeError):
        pass
