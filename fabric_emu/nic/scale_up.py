"""A server's scale-up domain (NVLink/NVSwitch-class) as a fluid model: no packets, only time.

Each GPU has an egress and an ingress port of `rate` bytes/s (emulated) into a non-blocking
crossbar. A transfer waits `latency` seconds after it starts, then moves its bytes as a fluid
flow; the concurrent moving transfers share the ports max-min fairly (each limited by its
sender's egress and its receiver's ingress), and rates change only when a transfer begins
moving or ends. Between such events nothing is computed: the engine calls advance(now) when
next_event() is due, or when a transfer starts, and wakes for nothing else.

Pure logic, no clock of its own: every call takes `now` (emulated seconds).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

_EPS_BYTES = 1e-6  # float residue below which a transfer has delivered its last byte


@dataclass(eq=False)
class _Transfer:
    key: Hashable
    src: str
    dst: str
    nbytes: int
    moves_at: float  # start + latency
    left: float = field(init=False)
    rate: float = 0.0

    def __post_init__(self) -> None:
        self.left = float(self.nbytes)


class ScaleUpDomain:
    """The transfers of one server's GPUs. start() a transfer, advance() to collect the ones
    whose last byte was delivered by then (with the exact time it was)."""

    def __init__(self, rate_Bps: float, latency_s: float):
        if rate_Bps <= 0 or latency_s < 0:
            raise ValueError(f"scale-up rate must be > 0 and latency >= 0 (got {rate_Bps}, {latency_s})")
        self.rate = rate_Bps
        self.latency = latency_s
        self._waiting: list[_Transfer] = []  # in their latency, by moves_at
        self._moving: list[_Transfer] = []
        self._t = 0.0  # the time the moving transfers' `left` refers to

    @property
    def time(self) -> float:
        """The time the model has been advanced to."""
        return self._t

    def start(self, key: Hashable, src: str, dst: str, nbytes: int, now: float) -> list[tuple[Hashable, float]]:
        """Begin a transfer at `now`; returns the transfers completed up to now (as advance)."""
        if src == dst:
            raise ValueError(f"scale-up transfer from {src} to itself")
        done = self.advance(now)
        t = _Transfer(key, src, dst, nbytes, now + self.latency)
        self._waiting.append(t)
        self._waiting.sort(key=lambda x: x.moves_at)
        if t.moves_at <= now:  # no latency: moves from now on
            done += self.advance(now)
        return done

    def next_event(self) -> float | None:
        """When the next transfer begins moving or ends (rates change), if any is under way."""
        return self._next()[0]

    def _next(self) -> tuple[float | None, list[_Transfer]]:
        """The next event's time and the moving transfers that end at it."""
        nxt = self._waiting[0].moves_at if self._waiting else None
        ending: list[_Transfer] = []
        for m in self._moving:
            end = self._t + m.left / m.rate
            if nxt is None or end < nxt:
                nxt, ending = end, [m]
            elif end == nxt:
                ending.append(m)
        return nxt, ending

    def advance(self, now: float) -> list[tuple[Hashable, float]]:
        """Move time to `now`: the (key, completion time) of each transfer that ended by then,
        in completion order."""
        done: list[tuple[Hashable, float]] = []
        while True:
            te, ending = self._next()
            if te is None or te > now:
                break
            self._progress(te)
            # Ended by their own end time, not by a residue test: at epoch-sized times a float
            # step is ~0.2 us, so `left` may not reach zero exactly (and must not loop forever).
            for m in ending:
                m.left = 0.0
            for m in self._moving:
                if m.left <= _EPS_BYTES:
                    done.append((m.key, te))
            self._moving = [m for m in self._moving if m.left > _EPS_BYTES]
            while self._waiting and self._waiting[0].moves_at <= te:
                self._moving.append(self._waiting.pop(0))
            self._share()
        if not self._moving:
            self._t = max(self._t, now)
        else:
            self._progress(max(self._t, now))
        return done

    def _progress(self, t: float) -> None:
        dt = t - self._t
        if dt > 0:
            for m in self._moving:
                m.left = max(0.0, m.left - m.rate * dt)
        self._t = t

    def _share(self) -> None:
        """Max-min fair rates by progressive filling over the GPUs' egress and ingress ports."""
        cap: dict[tuple[str, str], float] = {}
        users: dict[tuple[str, str], list[_Transfer]] = {}
        for m in self._moving:
            for port in (("out", m.src), ("in", m.dst)):
                cap[port] = self.rate
                users.setdefault(port, []).append(m)
        unfixed = set(self._moving)
        while unfixed:
            port = min((p for p in users if any(u in unfixed for u in users[p])),
                       key=lambda p: cap[p] / sum(u in unfixed for u in users[p]))
            flows = [u for u in users[port] if u in unfixed]
            share = cap[port] / len(flows)
            for m in flows:
                m.rate = share
                unfixed.discard(m)
                for p in (("out", m.src), ("in", m.dst)):
                    cap[p] -= share


class ScaleUpChannels:
    """One server's domain as the NIC engine and the program drivers of its GPUs use it: the
    messages of each scale-up channel, delivered in their order (the n-th message on a channel
    is delivered once it and every earlier one ended, as a QP would), and per-host counts."""

    def __init__(self, server: str, hosts: tuple[str, ...], rate_Bps: float, latency_s: float):
        self.server = server
        self.hosts = hosts
        self.domain = ScaleUpDomain(rate_Bps, latency_s)
        self.delivered: dict[int, list[float]] = {}  # channel -> delivery time of message 0, 1, ...
        self._ended: dict[int, dict[int, float]] = {}  # channel -> {seq: end} not yet in order
        self._info: dict[tuple[int, int], tuple[str, str, int]] = {}  # (channel, seq) -> src, dst, bytes
        self._woken: set[str] = set()  # hosts with deliveries they have not been told of
        self.stats = {h: {"sent_bytes": 0, "sent": 0, "received_bytes": 0, "received": 0} for h in hosts}

    def send(self, channel: int, seq: int, src: str, dst: str, nbytes: int, now: float) -> None:
        """Message `seq` of a channel starts at now (its send op's start)."""
        for h in (src, dst):
            if h not in self.stats:
                raise ValueError(f"scale-up channel {channel}: {h} is not a GPU of server {self.server}")
        self._info[(channel, seq)] = (src, dst, nbytes)
        self._record(self.domain.start((channel, seq), src, dst, nbytes, now))

    def next_event(self) -> float | None:
        """When the engine must call advance: at once if hosts wait to be told of a delivery."""
        if self._woken:
            return self.domain.time
        return self.domain.next_event()

    def advance(self, now: float) -> set[str]:
        """Deliver what ended by now; the hosts whose channels delivered since the last call."""
        self._record(self.domain.advance(now))
        woken, self._woken = self._woken, set()
        return woken

    def _record(self, done: list[tuple[Hashable, float]]) -> None:
        for key, t in done:
            c, seq = key  # type: ignore[misc]
            src, dst, nbytes = self._info.pop((c, seq))
            s, r = self.stats[src], self.stats[dst]
            s["sent"] += 1
            s["sent_bytes"] += nbytes
            r["received"] += 1
            r["received_bytes"] += nbytes
            ended = self._ended.setdefault(c, {})
            ended[seq] = t
            out = self.delivered.setdefault(c, [])
            while len(out) in ended:  # in order: a message is delivered after the one before it
                out.append(max(ended.pop(len(out)), out[-1] if out else t))
            self._woken.update((src, dst))
