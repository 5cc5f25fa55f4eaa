"""The end-of-run audit of the lossless accounting (fabric_emu.cc.charges)."""

from __future__ import annotations

from fabric_emu.cc.charges import charge_audit, charge_notes, signed


def test_a_wrapped_counter_reads_negative():
    assert signed(5) == 5
    assert signed((1 << 64) - 1042) == -1042


def test_balanced_accounting_has_nothing_to_say():
    a = charge_audit({"leaf1-eth1": 0, "leaf1-eth3": 0}, {}, settled=True)
    assert a["leaked_bytes"] == a["over_credited_bytes"] == 0 and not a["negative_pairs"]
    assert charge_notes(a) == []


def test_what_the_queues_hold_is_not_a_leak_but_what_no_queue_holds_is():
    # leaf1-eth1 holds 9 KB: 6 KB wait at leaf1-eth3 (paused) and 3 KB are in no queue.
    a = charge_audit({"leaf1-eth1": 9000, "leaf1-eth2": 4000},
                     {("leaf1-eth1", "leaf1-eth3"): 6000, ("leaf1-eth2", "leaf1-eth3"): 4000}, settled=True)
    assert a["queued_bytes"] == 10000 and a["held_bytes"] == 13000
    assert a["leaked_by_port"] == {"leaf1-eth1": 3000} and a["leaked_bytes"] == 3000
    (note,) = charge_notes(a)
    assert note.startswith("3000 B of lossless frames stayed charged to 1 switch ingress port(s)")
    assert "most on leaf1-eth1: 3000 B" in note


def test_credits_without_charges_are_reported():
    a = charge_audit({"s1-eth1": -1042, "s1-eth2": 0}, {("s1-eth2", "s1-eth1"): -2084}, settled=False)
    assert a["over_credited_by_port"] == {"s1-eth1": 1042, "s1-eth2": 2084}
    assert a["negative_pairs"] == ["s1-eth2>s1-eth1"] and not a["settled"]
    (note,) = charge_notes(a)
    assert "gave back 3126 B more than it charged on 2 port(s) (1 negative pair(s))" in note
