"""The NIC engine: one process serves the NICs of many hosts from a single event loop.

An idle host costs one receive socket in an epoll set and nothing per loop: the loop touches a
host only when its socket is readable, one of its timers is due, or it has packets waiting for
room in its QP sockets. Wake-ups are bounded: hosts whose sockets were full are filled again
once a tick (the kernel paces packets out of the socket buffers meanwhile), and the loop wakes
for arriving packets at most once a tick, so a busy host is served in batches rather than once
per packet. A tick is a few packet times at line rate (fabric_emu.nic.launch.tick_s): a reply
(ACK, CNP) leaves within a tick, 2.7 us of modelled time at 100 Gb/s.

Timers (RC retransmission, DCQCN's alpha and rate timers, a flow's start) sit in one heap with
lazy invalidation: an entry whose time no longer matches its owner's schedule is skipped.

Scale-up domains (fabric_emu.nic.scale_up: a server's GPUs, all served by this engine) send no
packets: the loop also wakes at a domain's next event (a transfer begins moving or ends), unless
it will wake within a tick anyway to fill sockets, and touches the hosts whose messages were
delivered. A run without servers pays one falsy test per loop, nothing per packet.
"""

from __future__ import annotations

import heapq
import itertools
import select
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

from fabric_emu.nic.host_nic import HostNic, SendQp
from fabric_emu.nic.scale_up import ScaleUpChannels

IDLE_POLL_S = 0.05  # longest sleep, so a stop request or the deadline is noticed quickly


class Driver(Protocol):
    """A workload on one host: posts messages on the NIC as its progress allows."""

    @property
    def finished(self) -> bool: ...

    @property
    def wake_at(self) -> float | None:
        """When the driver must act by the clock alone (a flow's start time), if ever."""

    def advance(self, now: float) -> None: ...


class Stopped(Protocol):
    def __bool__(self) -> bool: ...


@dataclass(eq=False)
class Host:
    """One host the engine serves: its NIC, its workload driver and how it ended."""

    name: str
    nic: HostNic
    make_driver: Callable[[float], Driver]
    driver: Driver | None = None
    finished_at: float | None = None
    error: str | None = None
    _wake: float | None = field(default=None, repr=False)

    @property
    def done(self) -> bool:
        return self.finished_at is not None or self.error is not None


class Engine:
    def __init__(self, hosts: list[Host], tick_s: float, clock: Callable[[], float],
                 domains: list[ScaleUpChannels] | None = None):
        self.hosts = hosts
        self.domains = domains or []
        self._by_name = {h.name: h for h in hosts}
        self.tick_s = tick_s
        self.clock = clock
        self._heap: list[tuple[float, int, Host, SendQp | None]] = []
        self._seq = itertools.count()
        self._scheduled: dict[int, float] = {}  # id(SendQp) -> the time it is queued for
        # How well the engine kept up: a wake-up more than a tick after it was due means the
        # QP sockets (two ticks deep) may have run dry, and the kernel idled waiting for us.
        self.wakes = self.late_wakes = 0
        self.max_late_s = 0.0

    def run(self, go: float, stop: Stopped, deadline: float) -> None:
        """Serve every host from GO until all are done, a stop request, or the deadline."""
        ep, by_fd = self._receive_poller()
        for h in self.hosts:
            h.driver = h.make_driver(go)
        pending: set[Host] = set()  # hosts with packets waiting for room in their sockets
        touched: set[Host] = set(self.hosts)
        unfinished = len(self.hosts)
        next_fill = self.clock()
        woke = 0.0
        try:
            while unfinished:
                t = self.clock()
                if stop or t >= deadline:
                    return
                self._fire_timers(t, touched)
                if self.domains:
                    self._advance_domains(t, touched)
                if pending and t >= next_fill:  # full sockets are retried once a tick
                    touched |= pending
                    next_fill = t + self.tick_s
                for h in touched:
                    if h.done:
                        continue
                    if self._serve(h, t):
                        pending.add(h)
                    else:
                        pending.discard(h)
                    if h.done:
                        unfinished -= 1
                        pending.discard(h)
                touched = set()
                if not unfinished:
                    return
                if pending and next_fill <= t:  # newly full sockets: first retry a tick from now
                    next_fill = t + self.tick_s
                # Sleep: until the next timer or fill, or a packet arrives; but wake at most
                # once a tick, so a busy host is served in batches, not once per packet.
                t = self.clock()
                wake = next_fill if pending else t + IDLE_POLL_S
                if self._heap:
                    wake = min(wake, self._heap[0][0])
                if self.domains and not pending:
                    # While packets wait for socket room the loop wakes each tick anyway: scale-up
                    # events ride on those wake-ups rather than adding their own (a delivery's
                    # time is exact; its dependent ops start when it is noticed, as after a
                    # fabric op). Otherwise the loop wakes at the domain's next event.
                    wake = min(wake, self._domains_due(wake))
                wake = min(wake, deadline)
                early = woke + self.tick_s - t
                if early > 0 and wake > t:
                    time.sleep(min(early, wake - t))
                    t = self.clock()
                events = ep.poll(max(0.0, wake - t))
                woke = self.clock()
                self.wakes += 1
                if not events and woke > wake:
                    late = woke - wake
                    self.max_late_s = max(self.max_late_s, late)
                    self.late_wakes += late > self.tick_s
                for fd, _ in events:
                    h = by_fd[fd]
                    for sq in h.nic.receive(self.clock()):
                        self._schedule(h, sq)
                    touched.add(h)
        finally:
            ep.close()

    def drain(self, stop: Callable[[], bool], deadline: float) -> None:
        """After every host finished: receive (and count, and answer) what still arrives, until
        stop() or the deadline. Nothing new is sent."""
        ep, by_fd = self._receive_poller()
        try:
            while not stop() and self.clock() < deadline:
                for fd, _ in ep.poll(IDLE_POLL_S):
                    by_fd[fd].nic.receive(self.clock())
        finally:
            ep.close()

    def _receive_poller(self) -> tuple[select.epoll, dict[int, Host]]:
        """An epoll set of every host's receive socket, and the host of each descriptor."""
        by_fd = {h.nic.socks.receive.fileno(): h for h in self.hosts}
        ep = select.epoll()
        for fd in by_fd:
            ep.register(fd, select.EPOLLIN)
        return ep, by_fd

    def _serve(self, h: Host, t: float) -> bool:
        """Advance the host's workload and hand its packets to the kernel; True while packets
        wait for room in a socket."""
        nic, driver = h.nic, h.driver
        driver.advance(t)
        waiting = False
        for _ in range(4):  # a step whose last packet just left may post the next one
            if driver.finished:
                break
            waiting = nic.fill(t)
            if waiting:
                break
            driver.advance(t)
            if nic.idle:
                break
        if nic.error is not None:
            h.error = nic.error
            return False
        if driver.finished:
            self._finish(h, t)
            return False
        for sq in nic.send_qps:
            self._schedule(h, sq)
        wake = driver.wake_at
        if wake is not None and wake != h._wake:
            h._wake = wake
            heapq.heappush(self._heap, (wake, next(self._seq), h, None))
        return waiting

    @staticmethod
    def _finish(h: Host, t: float) -> None:
        h.finished_at = t
        sent = sum(sq.messages_done for sq in h.nic.send_qps)
        received = sum(rq.messages for rq in h.nic.recv_qps)
        h.nic.log(t, f"finished: {sent} messages sent and acknowledged, {received} received")

    def _schedule(self, h: Host, sq: SendQp) -> None:
        due = sq.due()
        if due is None:
            return
        key = id(sq)
        queued = self._scheduled.get(key)
        if queued is None or due < queued:
            self._scheduled[key] = due
            heapq.heappush(self._heap, (due, next(self._seq), h, sq))

    def _advance_domains(self, t: float, touched: set[Host]) -> None:
        """Deliver the scale-up messages that ended by t; touch their senders and receivers."""
        for d in self.domains:
            due = d.next_event()
            if due is not None and due <= t:
                for name in d.advance(t):
                    h = self._by_name.get(name)
                    if h is not None:
                        touched.add(h)

    def _domains_due(self, wake: float) -> float:
        for d in self.domains:
            due = d.next_event()
            if due is not None and due < wake:
                wake = due
        return wake

    def _fire_timers(self, t: float, touched: set[Host]) -> None:
        heap = self._heap
        while heap and heap[0][0] <= t:
            due, _, h, sq = heapq.heappop(heap)
            touched.add(h)
            if sq is None:  # a driver's wake-up
                continue
            if self._scheduled.get(id(sq)) != due:
                continue  # superseded by an earlier entry
            del self._scheduled[id(sq)]
            if not h.done:
                h.nic.on_timers(sq, t)
                self._schedule(h, sq)
