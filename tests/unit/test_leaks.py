"""Bytes charged to an ingress port for frames OVS lost: found once the port stands still, and
given back atomically (fabric_emu.ports.leaks)."""

from __future__ import annotations

import ctypes

from fabric_emu.ports.leaks import Atomics, LeakCheck


def test_a_port_standing_still_with_bytes_no_egress_holds_is_credited_once():
    c = LeakCheck(quiet_s=1.0)
    assert c.poll(0.0, {1: 9000}, {}) == {}
    assert c.candidates({1: 9000}, 0.4) == []  # not still long enough to read pair_held
    assert c.candidates({1: 9000}, 0.6) == [1]
    assert c.poll(0.6, {1: 9000}, {1: 5000}) == {}  # first sight of what the egresses hold
    assert c.poll(1.2, {1: 9000}, {1: 5000}) == {}  # the admitted side still for 0.6 s only
    assert c.poll(1.7, {1: 9000}, {1: 5000}) == {1: 4000}
    assert c.credited == {1: 4000}
    assert c.poll(2.0, {1: 5000}, {1: 5000}) == {}  # after the credit: a new start


def test_moving_bytes_or_bytes_all_in_egress_queues_are_never_credited():
    c = LeakCheck(quiet_s=1.0)
    for t in range(10):  # held changes: frames going through OVS
        assert c.poll(t * 0.5, {1: 9000 + t}, {1: 5000}) == {}
    c = LeakCheck(quiet_s=1.0)
    for t in range(10):  # a deadlocked port: everything it holds waits in egress queues
        assert c.poll(t * 0.5, {2: 9000}, {2: 9000}) == {}
    c = LeakCheck(quiet_s=1.0)
    for t in range(10):  # OVS still admitting what was charged earlier
        assert c.poll(t * 0.5, {3: 9000}, {3: 5000 + t}) == {}
    assert c.credited == {}


def test_atomics_subtract_and_swap_in_place():
    words = (ctypes.c_uint64 * 2)(10_000, 1)
    a = Atomics()
    base = ctypes.addressof(words)
    assert a.fetch_sub(base, 4_000) == 10_000 and words[0] == 6_000
    assert not a.compare_and_swap(base + 8, 0, 5) and words[1] == 1
    assert a.compare_and_swap(base + 8, 1, 0) and words[1] == 0
