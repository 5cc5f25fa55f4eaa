"""PFC deadlock detection, pure: cycles in the wait-for graph of the switches' lossless ingress
buffers (Hu et al., "Deadlocks in Datacenter Networks: Why Do They Form, and How to Avoid
Them", HotNets 2016), tracked over samples in modelled seconds since traffic started.

X.in(Y) is the lossless buffer of switch X holding bytes that entered X from neighbour Y. It
waits on Z.in(X) when it holds bytes for the egress X->Z and Z pauses that egress: those bytes
leave only once Z.in(X) drains below xon. A cycle of such waits never drains on its own: a
deadlock. Hosts are never members: a NIC that pauses its leaf is a storm or a slow receiver,
and drains (or is cut off by the watchdog) without anyone waiting on it in turn. Such waits
are kept on the waiting buffer's node (`waits_on_hosts`) so they can be labelled, never edges.

A cycle seen at one sample may be transient congestion that clears a pause time later; it
"persisted" once samples saw it for at least `min_duration_s` (a few pause times, or the PFC
watchdog's detection time). A cycle that breaks and forms again is a new episode: formations
are counted, and the mean time between them is the deadlock's period.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

import networkx as nx

# Times are compared to the nanosecond: sums of float sample times (0.001 + 0.004) must not
# make a cycle seen for exactly min_duration_s miss it.
TIME_EPS_S = 1e-9
ARROW = " -> "  # between members in a cycle's text (deadlocks.csv)


@dataclass(frozen=True, order=True)
class Buffer:
    """X.in(Y): switch X's lossless ingress buffer of the bytes that came from Y."""

    switch: str
    upstream: str

    def __str__(self) -> str:
        return f"{self.switch}.in({self.upstream})"

    @classmethod
    def parse(cls, text: str) -> "Buffer":
        switch, sep, rest = text.strip().partition(".in(")
        if not sep or not rest.endswith(")") or not switch:
            raise ValueError(f"not a buffer X.in(Y): {text!r}")
        return cls(switch, rest[:-1])


Cycle = tuple[Buffer, ...]


def canonical(members: Sequence[Buffer]) -> Cycle:
    """The cycle rotated to start at its smallest member: one name for every rotation."""
    if not members:
        raise ValueError("a cycle has at least one member")
    i = members.index(min(members))
    return tuple(members[i:]) + tuple(members[:i])


def cycle_text(members: Sequence[Buffer]) -> str:
    return ARROW.join(map(str, members))


def parse_cycle(text: str) -> Cycle:
    """The members of a cycle written by cycle_text (deadlocks.csv's `cycle`)."""
    return canonical([Buffer.parse(part) for part in text.split(ARROW.strip())])


def egresses(members: Sequence[Buffer]) -> list[tuple[str, str]]:
    """The paused egresses (X, Z) of a cycle, in its order: member Z.in(X) exists on a cycle
    only because X's bytes wait on it, so every member names one paused egress X->Z."""
    return [(b.upstream, b.switch) for b in members[1:]] + [(members[0].upstream, members[0].switch)]


def waits_from_pairs(pairs: Mapping[tuple[int, int], int], names: Mapping[int, tuple[str, str]],
                     paused_ids: Collection[int]) -> tuple[dict[tuple[str, str, str], int], set[tuple[str, str]]]:
    """wait_for_graph's (held, paused) from the port program's pair map (lossless bytes per
    (ingress port id, egress port id)): names gives each switch port id its (switch, peer);
    paused_ids the ports whose lossless egress is paused now."""
    held: dict[tuple[str, str, str], int] = {}
    for (i, o), n in pairs.items():
        a, b = names.get(i), names.get(o)
        if a is not None and b is not None and a[0] == b[0]:
            held[(a[0], a[1], b[1])] = held.get((a[0], a[1], b[1]), 0) + n
    return held, {names[i] for i in paused_ids if i in names}


def wait_for_graph(held: Mapping[tuple[str, str, str], int], paused: Collection[tuple[str, str]],
                   switches: Collection[str]) -> nx.DiGraph:
    """The wait-for graph of one sample.

    held[(X, Y, Z)]: lossless bytes switch X holds now that entered from Y and wait for the
    egress X->Z. paused: {(X, Z)}, X's egress toward Z is paused by Z now. An edge
    Buffer(X, Y) -> Buffer(Z, X) (attribute `bytes`) when those bytes are held, the egress is
    paused and Z is a switch; when Z is a host the bytes go to the waiting buffer's node
    attribute `waits_on_hosts` {host: bytes} instead."""
    switches = set(switches)
    paused = set(paused)
    g = nx.DiGraph()
    for (x, y, z), n in held.items():
        # A host's own buffer is never a member; nor is a byte count of 0 a wait.
        if n <= 0 or x not in switches or x == z or (x, z) not in paused:
            continue
        waiter = Buffer(x, y)
        if z in switches:
            g.add_edge(waiter, Buffer(z, x), bytes=int(n))
        else:
            g.add_node(waiter)
            hosts = g.nodes[waiter].setdefault("waits_on_hosts", {})
            hosts[z] = hosts.get(z, 0) + int(n)
    return g


def cycles(g: nx.DiGraph) -> list[Cycle]:
    """Every elementary cycle, each starting at its smallest member, sorted: deterministic
    whatever order the samples' dicts came in."""
    return sorted(canonical(c) for c in nx.simple_cycles(g))


def cycle_bytes(g: nx.DiGraph, members: Cycle) -> tuple[int, ...]:
    """Bytes on each edge of the cycle, the edge leaving members[i] first."""
    return tuple(g.edges[a, b]["bytes"] for a, b in zip(members, members[1:] + members[:1]))


def host_waits(g: nx.DiGraph) -> list[tuple[Buffer, str, int]]:
    """(buffer, host, bytes): buffers held up by a pausing NIC, a storm or a slow receiver."""
    return sorted((b, h, n) for b, d in g.nodes(data=True)
                  for h, n in (d.get("waits_on_hosts") or {}).items())


@dataclass
class Episode:
    """One formation of one cycle, as the samples saw it."""

    members: Cycle
    formed_s: float  # the first sample it was seen in
    last_seen_s: float
    broken_s: float | None = None  # the first sample it was no longer seen in (None: still there)
    samples: int = 1
    max_bytes: int = 0  # most bytes held on the cycle's edges at one sample
    edge_bytes: tuple[int, ...] = field(default=())  # per edge, at that sample

    @property
    def seen_s(self) -> float:
        """From the first sample that saw it to the last: what the samples prove it lasted."""
        return self.last_seen_s - self.formed_s

    def duration_s(self, end_s: float) -> float:
        """Formed to broken, or to end_s if it never broke."""
        return (self.broken_s if self.broken_s is not None else end_s) - self.formed_s

    def persisted(self, min_s: float) -> bool:
        # Seen, not merely not-yet-broken: a cycle in one sample proves nothing about its life.
        return self.seen_s >= min_s - TIME_EPS_S

    def active_at(self, at_s: float, slack_s: float | None = None) -> bool:
        """Whether the cycle was there at at_s, give or take slack_s (by default one sample
        interval, broken_s - last_seen_s: the samples cannot place it closer)."""
        if slack_s is None:
            slack_s = self.broken_s - self.last_seen_s if self.broken_s is not None else 0.0
        return (self.formed_s - slack_s - TIME_EPS_S <= at_s
                and (self.broken_s is None or at_s <= self.broken_s + slack_s + TIME_EPS_S))


class DeadlockTracker:
    """Feed it samples in time order; it keeps every episode of every cycle."""

    def __init__(self, min_duration_s: float):
        if min_duration_s <= 0:
            raise ValueError("min_duration_s must be > 0: one sample is not a deadlock")
        self.min_duration_s = min_duration_s
        self.episodes: list[Episode] = []  # every formation, in order of formation
        self._active: dict[Cycle, Episode] = {}
        self._last_t: float | None = None
        self.end_s: float | None = None

    def sample(self, t_s: float, held: Mapping[tuple[str, str, str], int],
               paused: Collection[tuple[str, str]], switches: Collection[str]) -> list[Cycle]:
        """Take one sample; returns the cycles seen now."""
        if self._last_t is not None and t_s < self._last_t:
            raise ValueError(f"samples go back in time: {t_s} after {self._last_t}")
        self._last_t = t_s
        g = wait_for_graph(held, paused, switches)
        now = cycles(g)
        for members in now:
            per_edge = cycle_bytes(g, members)
            ep = self._active.get(members)
            if ep is None:
                ep = Episode(members, t_s, t_s, max_bytes=sum(per_edge), edge_bytes=per_edge)
                self._active[members] = ep
                self.episodes.append(ep)
                continue
            ep.last_seen_s, ep.samples = t_s, ep.samples + 1
            if sum(per_edge) > ep.max_bytes:
                ep.max_bytes, ep.edge_bytes = sum(per_edge), per_edge
        for members in set(self._active) - set(now):
            self._active.pop(members).broken_s = t_s
        return now

    def finish(self, end_s: float) -> None:
        """The end of the samples: cycles still there stay unbroken (broken_s None)."""
        self.end_s = end_s

    @property
    def _end(self) -> float:
        return self.end_s if self.end_s is not None else (self._last_t or 0.0)

    def persistent(self) -> list[Episode]:
        return [e for e in self.episodes if e.persisted(self.min_duration_s)]

    def formations(self, members: Sequence[Buffer]) -> int:
        key = canonical(members)
        return sum(e.members == key for e in self.episodes)

    def rows(self) -> list[dict]:
        """deadlocks.csv: one row per episode, in order of formation."""
        return [{
            "cycle": cycle_text(e.members),
            "length": len(e.members),
            "formed_s": _r(e.formed_s),
            "last_seen_s": _r(e.last_seen_s),
            "broken_s": "" if e.broken_s is None else _r(e.broken_s),
            "duration_s": _r(e.duration_s(self._end)),
            "samples": e.samples,
            "max_bytes": e.max_bytes,
            "edge_bytes": " ".join(map(str, e.edge_bytes)),
            "persisted": e.persisted(self.min_duration_s),
        } for e in self.episodes]

    def summary(self) -> dict:
        """summary.json's `deadlocks`: plain data only."""
        by_cycle: dict[Cycle, list[Episode]] = {}
        for e in self.episodes:
            by_cycle.setdefault(e.members, []).append(e)
        gaps = [b.formed_s - a.formed_s for eps in by_cycle.values() for a, b in zip(eps, eps[1:])]
        persistent = []
        for members, eps in by_cycle.items():
            kept = [e for e in eps if e.persisted(self.min_duration_s)]
            if not kept:
                continue
            own_gaps = [b.formed_s - a.formed_s for a, b in zip(eps, eps[1:])]
            persistent.append({
                "cycle": cycle_text(members), "length": len(members),
                "formations": len(eps), "persistent_formations": len(kept),
                "first_formed_s": _r(kept[0].formed_s),
                "longest_s": _r(max(e.duration_s(self._end) for e in kept)),
                "max_bytes": max(e.max_bytes for e in kept),
                "period_s": _r(statistics.fmean(own_gaps)) if own_gaps else None,
                "unbroken_at_end": eps[-1].broken_s is None and eps[-1].persisted(self.min_duration_s),
            })
        persistent.sort(key=lambda p: (p["first_formed_s"], p["cycle"]))
        firsts = [e.formed_s for e in self.persistent()]
        return {
            "min_duration_s": self.min_duration_s,
            "cycles_seen": len(by_cycle),
            "formations": len(self.episodes),
            "persistent_formations": len(firsts),
            "first_formed_s": _r(self.episodes[0].formed_s) if self.episodes else None,
            "first_persistent_s": _r(min(firsts)) if firsts else None,
            "period_s": _r(statistics.fmean(gaps)) if gaps else None,
            "deadlocked_at_end": any(p["unbroken_at_end"] for p in persistent),
            "persistent": persistent,
        }


def _r(t: float) -> float:
    return round(t, 9)  # nanoseconds: no float noise in the files


def label_watchdog_event(switch: str, peer: str, at_s: float, episodes: Sequence[Episode],
                         storming: Collection[str], slack_s: float | None = None) -> str:
    """What a PFC watchdog storm detected on the egress queue switch->peer at at_s was:
    "storm source" (peer is a NIC storming), "deadlock member" (the egress is on a cycle there
    then, within slack_s, by default one sample interval) or "victim" (paused by someone else's
    storm or deadlock spreading back)."""
    if peer in storming:
        return "storm source"
    for e in episodes:
        if (switch, peer) in egresses(e.members) and e.active_at(at_s, slack_s):
            return "deadlock member"
    return "victim"
