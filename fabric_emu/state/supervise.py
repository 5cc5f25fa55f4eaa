"""The run's parts watched while traffic flows: a small registry of components, each with a
probe (is it still up? if not, how did it end) and a policy (restart it, or end the run).

What a part's death means is decided here, purely (decide, describe_exit, death_message); the
probes and restarts are the callers' plumbing (fabric_emu.run.supervise builds a run's registry;
fabric_emu.nic.launch adds its NIC engines). Polling happens inside loops that already wait
(the NIC engines' wait for DONE), at most every `interval_s`: nothing per packet.

Policies: "restart" (the PFC daemon: a fresh one with the same config; up to `max_restarts`
times, then the run fails: a part that keeps dying is broken, not unlucky), "fail" (a NIC
engine, Open vSwitch, the exporter: the run ends at once as `failed`, keeps what it measured
and tears down). The controller is kept by its own keeper (fabric_emu.fabric.keeper), which
also serves the `controller:` events.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

Policy = Literal["restart", "fail"]
CHECK_INTERVAL_S = 0.2  # a dead part is noticed within this (plus the loop's own wait)
MAX_RESTARTS = 3


@dataclass
class Component:
    """One watched part. probe() returns None while it is up, else how it ended (`describe_exit`
    words: "was killed by signal 9 (SIGKILL)"); restart() brings it back (policy "restart") and
    returns what the run should know of it (e.g. gates it reopened)."""

    name: str  # as a user reads it: "NIC engine 2 (hosts h3, h7)", "the PFC daemon"
    kind: str  # "nic", "pfc-daemon", "ovs", "exporter" (and later "controller")
    policy: Policy
    probe: Callable[[], str | None]
    restart: Callable[[], dict] | None = None


class ComponentFailed(Exception):
    """A part of the run died and its policy ends the run; str() is the summary's error."""

    def __init__(self, message: str, kind: str, at_s: float | None):
        super().__init__(message)
        self.kind = kind
        self.at_s = at_s  # seconds after traffic started (None: before it started)


def describe_exit(returncode: int | None) -> str | None:
    """How a child process ended, from Popen.returncode (None: still running)."""
    if returncode is None:
        return None
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "?"
        return f"was killed by signal {-returncode} ({name})"
    return f"exited with code {returncode}"


def when(at_s: float | None) -> str:
    return "before traffic started" if at_s is None else f"{at_s:.1f} s after traffic started"


def death_message(name: str, how: str, at_s: float | None) -> str:
    """The summary's error: "NIC engine 2 (hosts h3, h7) was killed by signal 9 (SIGKILL) 1.8 s
    after traffic started; the run was ended"."""
    return f"{name} {how} {when(at_s)}; the run was ended"


def decide(policy: Policy, restarts_so_far: int, max_restarts: int = MAX_RESTARTS) -> Policy:
    """What to do about a dead part: its policy, unless it already came back too often."""
    if policy == "restart" and restarts_so_far < max_restarts:
        return "restart"
    return "fail"


@dataclass
class Supervisor:
    """The registry, and check(), which the waiting loops call."""

    clock: Callable[[], float] = time.monotonic
    interval_s: float = CHECK_INTERVAL_S
    components: dict[str, Component] = field(default_factory=dict)
    restarts: list[dict] = field(default_factory=list)  # what came back: the summary's record
    # told of a restarted part's new process (restart() returning {"pid": ...}): the CPU
    # monitor's watch, so a restarted daemon's CPU is sampled, not its dead predecessor's
    on_new_pid: Callable[[int, str], None] | None = None
    started: float | None = None  # when traffic started (monotonic), for "at 1.8 s"
    _last: float = float("-inf")

    def add(self, component: Component) -> None:
        self.components[component.name] = component

    def remove(self, name: str) -> None:
        self.components.pop(name, None)

    def remove_kind(self, kind: str) -> None:
        self.components = {n: c for n, c in self.components.items() if c.kind != kind}

    def traffic_started(self, at: float | None = None) -> None:
        self.started = self.clock() if at is None else at

    def since_start(self, now: float) -> float | None:
        return None if self.started is None else max(0.0, now - self.started)

    def check(self, force: bool = False) -> None:
        """Probe every part (at most every interval_s unless forced); restart those whose policy
        says so, raise ComponentFailed for the first that ends the run."""
        now = self.clock()
        if not force and now - self._last < self.interval_s:
            return
        self._last = now
        for c in list(self.components.values()):
            how = c.probe()
            if how is None:
                continue
            at = self.since_start(now)
            done = sum(r["component"] == c.name for r in self.restarts)
            if decide(c.policy, done) == "restart" and c.restart is not None:
                t = self.clock()
                info = c.restart()
                self.restarts.append({"component": c.name, "kind": c.kind, "how": how, "at_s": at,
                                      "restarted_in_s": round(self.clock() - t, 3), **info})
                if self.on_new_pid is not None and "pid" in info:
                    self.on_new_pid(info["pid"], c.kind)
                continue
            again = f" (it had been restarted {done} time(s))" if done else ""
            raise ComponentFailed(death_message(c.name, how + again, at), c.kind, at)
