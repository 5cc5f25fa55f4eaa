"""The PFC deadlock detector without root: wait-for graphs and their cycles on hand-made
fabrics (a ring, a Clos bounce), the tracker's episodes over samples, its rows and summary,
and the labels of the watchdog's storms."""

from __future__ import annotations

import json

import pytest

from fabric_emu.cc.deadlock import (Buffer, DeadlockTracker, cycle_text, cycles, egresses, host_waits,
                                    label_watchdog_event, parse_cycle, wait_for_graph)

RING = ["r1", "r2", "r3", "r4"]
MS = 1e-3


def _ring(bytes_held: int = 30_000) -> tuple[dict, set, list]:
    """r(i).in(r(i-1)) holds bytes for r(i+1), and r(i+1) pauses r(i): the textbook deadlock."""
    held, paused = {}, set()
    for i, x in enumerate(RING):
        prev, nxt = RING[i - 1], RING[(i + 1) % 4]
        held[(x, prev, nxt)] = bytes_held + i
        paused.add((x, nxt))
    return held, paused, RING


def _buffers(*pairs: str) -> tuple[Buffer, ...]:
    return tuple(Buffer(*p.split(".")) for p in pairs)


def test_ring_is_one_four_buffer_cycle():
    g = wait_for_graph(*_ring())
    assert cycles(g) == [_buffers("r1.r4", "r2.r1", "r3.r2", "r4.r3")]
    assert g.edges[Buffer("r1", "r4"), Buffer("r2", "r1")]["bytes"] == 30_000
    assert str(Buffer("r1", "r4")) == "r1.in(r4)"


def test_one_egress_running_breaks_the_ring():
    held, paused, sw = _ring()
    paused.discard(("r3", "r4"))
    assert cycles(wait_for_graph(held, paused, sw)) == []


def test_zero_bytes_is_no_edge():
    held, paused, sw = _ring()
    held[("r2", "r1", "r3")] = 0
    g = wait_for_graph(held, paused, sw)
    assert not g.has_edge(Buffer("r2", "r1"), Buffer("r3", "r2"))
    assert cycles(g) == []


def test_bytes_for_a_host_never_close_a_cycle():
    """Every ring switch's bytes wait for its own host, whose NIC pauses it: a storm, not a cycle."""
    held = {(x, RING[i - 1], f"h{i + 1}"): 50_000 for i, x in enumerate(RING)}
    paused = {(x, f"h{i + 1}") for i, x in enumerate(RING)} | set(_ring()[1])
    g = wait_for_graph(held, paused, RING)
    assert cycles(g) == [] and g.number_of_edges() == 0
    assert host_waits(g)[0] == (Buffer("r1", "r4"), "h1", 50_000)
    assert len(host_waits(g)) == 4
    # and a host's own "buffer" is never a node, whatever it holds
    g = wait_for_graph({("h1", "r1", "r2"): 10}, {("h1", "r2")}, RING)
    assert g.number_of_nodes() == 0


def test_six_buffer_bounce_on_a_clos():
    """3 spines x 4 leaves: bytes bounce leaf -> spine -> leaf (a routing loop or a failed link's
    reroute), each leaf's buffer from one spine holding bytes for the next spine."""
    spines, leaves = ["spine1", "spine2", "spine3"], ["leafA", "leafB", "leafC", "leafD"]
    chain = [("spine1", "leafC", "leafA"), ("leafA", "spine1", "spine2"), ("spine2", "leafA", "leafB"),
             ("leafB", "spine2", "spine3"), ("spine3", "leafB", "leafC"), ("leafC", "spine3", "spine1")]
    held = {k: 20_000 for k in chain}
    held[("leafD", "hostD", "spine1")] = 9_000  # a victim: its egress is not paused
    held[("leafA", "spine1", "hostA")] = 4_000  # waits on a NIC as well
    paused = {(x, z) for x, _, z in chain} | {("leafA", "hostA")}
    g = wait_for_graph(held, paused, spines + leaves)
    (c,) = cycles(g)
    assert len(c) == 6
    assert cycle_text(c) == ("leafA.in(spine1) -> spine2.in(leafA) -> leafB.in(spine2) -> "
                             "spine3.in(leafB) -> leafC.in(spine3) -> spine1.in(leafC)")
    assert egresses(c)[0] == ("leafA", "spine2") and ("spine1", "leafA") in egresses(c)
    assert host_waits(g) == [(Buffer("leafA", "spine1"), "hostA", 4_000)]


def test_two_disjoint_cycles_sorted():
    held, paused, sw = _ring()
    # a two-buffer cycle elsewhere: s1 and s2 bounce bytes back at each other
    held.update({("s2", "s1", "s1"): 7, ("s1", "s2", "s2"): 8})
    paused |= {("s1", "s2"), ("s2", "s1")}
    got = cycles(wait_for_graph(held, paused, [*sw, "s1", "s2"]))
    assert got == [_buffers("r1.r4", "r2.r1", "r3.r2", "r4.r3"), _buffers("s1.s2", "s2.s1")]
    # the same whatever order the sample's dict came in
    assert cycles(wait_for_graph(dict(reversed(held.items())), paused, [*sw, "s1", "s2"])) == got


def test_parse_cycle_round_trips():
    c = _buffers("r1.r4", "r2.r1", "r3.r2", "r4.r3")
    assert parse_cycle(cycle_text(c)) == c
    assert parse_cycle(cycle_text(c[2:] + c[:2])) == c  # any rotation
    with pytest.raises(ValueError):
        parse_cycle("r1 -> r2")


def _feed(tr: DeadlockTracker, ms_with_cycle: set[int], until_ms: int) -> None:
    ring, none = _ring(), ({}, set(), RING)
    for ms in range(1, until_ms + 1):
        tr.sample(ms * MS, *(ring if ms in ms_with_cycle else none))
    tr.finish(until_ms * MS)


@pytest.mark.parametrize("min_ms, persisted", [(4, True), (5, False), (1, True)])
def test_one_episode_formed_and_broken(min_ms: int, persisted: bool):
    tr = DeadlockTracker(min_duration_s=min_ms * MS)
    _feed(tr, {1, 2, 3, 4, 5}, 8)
    (e,) = tr.episodes
    assert (e.formed_s, e.last_seen_s, e.broken_s, e.samples) == (1 * MS, 5 * MS, 6 * MS, 5)
    assert e.max_bytes == sum(30_000 + i for i in range(4)) and len(e.edge_bytes) == 4
    assert e.duration_s(8 * MS) == pytest.approx(5 * MS)
    assert e.persisted(min_ms * MS) is persisted
    assert (tr.persistent() == [e]) is persisted


def test_unbroken_at_the_end():
    tr = DeadlockTracker(min_duration_s=2 * MS)
    _feed(tr, {3, 4, 5, 6}, 6)
    (e,) = tr.episodes
    assert e.broken_s is None and e.duration_s(6 * MS) == pytest.approx(3 * MS)
    row = tr.rows()[0]
    assert row["broken_s"] == "" and row["persisted"] is True
    s = tr.summary()
    assert s["deadlocked_at_end"] is True and s["persistent"][0]["unbroken_at_end"] is True


def test_form_break_form_counts_two_formations():
    tr = DeadlockTracker(min_duration_s=2 * MS)
    _feed(tr, {1, 2, 3, 6, 7, 8}, 10)
    assert [(e.formed_s, e.broken_s) for e in tr.episodes] == [(1 * MS, 4 * MS), (6 * MS, 9 * MS)]
    ring = tr.episodes[0].members
    assert tr.formations(ring) == 2 == tr.formations(ring[1:] + ring[:1])
    s = tr.summary()
    assert s["formations"] == 2 and s["cycles_seen"] == 1 and s["persistent_formations"] == 2
    assert s["period_s"] == pytest.approx(5 * MS) == s["persistent"][0]["period_s"]
    assert s["first_formed_s"] == pytest.approx(1 * MS) and s["deadlocked_at_end"] is False


def test_transient_cycle_is_not_persistent():
    tr = DeadlockTracker(min_duration_s=1 * MS)
    _feed(tr, {4}, 6)
    (e,) = tr.episodes
    assert e.samples == 1 and e.broken_s == 5 * MS
    assert tr.persistent() == []
    s = tr.summary()
    assert s["cycles_seen"] == 1 and s["persistent"] == [] and s["first_persistent_s"] is None
    assert s["period_s"] is None
    with pytest.raises(ValueError):
        DeadlockTracker(min_duration_s=0)


def test_rows_and_summary_are_json():
    tr = DeadlockTracker(min_duration_s=2 * MS)
    _feed(tr, {1, 2, 3, 6}, 8)
    rows = tr.rows()
    assert list(rows[0]) == ["cycle", "length", "formed_s", "last_seen_s", "broken_s", "duration_s",
                             "samples", "max_bytes", "edge_bytes", "persisted"]
    assert rows[0]["cycle"] == "r1.in(r4) -> r2.in(r1) -> r3.in(r2) -> r4.in(r3)"
    assert [r["persisted"] for r in rows] == [True, False]
    json.loads(json.dumps(rows))
    s = json.loads(json.dumps(tr.summary()))
    assert s["persistent"][0]["formations"] == 2 and s["persistent"][0]["persistent_formations"] == 1


def test_samples_must_go_forward():
    tr = DeadlockTracker(min_duration_s=1 * MS)
    tr.sample(2 * MS, *_ring())
    with pytest.raises(ValueError):
        tr.sample(1 * MS, *_ring())


def test_watchdog_labels():
    tr = DeadlockTracker(min_duration_s=2 * MS)
    _feed(tr, {1, 2, 3, 4, 5}, 9)  # formed 1 ms, broken 6 ms
    eps = tr.episodes
    assert label_watchdog_event("r1", "h1", 3 * MS, eps, storming={"h1"}) == "storm source"
    assert label_watchdog_event("r1", "r2", 3 * MS, eps, storming={"h1"}) == "deadlock member"
    assert label_watchdog_event("r2", "r1", 3 * MS, eps, storming=()) == "victim"  # the wrong way round
    assert label_watchdog_event("r4", "r1", 6.5 * MS, eps, storming=()) == "deadlock member"  # one sample late
    assert label_watchdog_event("r4", "r1", 8 * MS, eps, storming=()) == "victim"  # long after it broke
    assert label_watchdog_event("r4", "r1", 8 * MS, eps, storming=(), slack_s=3 * MS) == "deadlock member"
    assert label_watchdog_event("leaf1", "spine1", 3 * MS, eps, storming=()) == "victim"
