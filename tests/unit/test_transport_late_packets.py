"""The in-order responder tells a gap a late packet filled (reordering on a single-path flow)
from one the resend filled (loss): `reordered` counts the first kind only."""

from __future__ import annotations

from fabric_emu.wire import roce
from fabric_emu.nic.transport import NAK_SEQ, Responder
from tests.unit.test_transport import Wire, pair

MIDDLE = roce.RC_RDMA_WRITE_MIDDLE


def feed(r: Responder, psns: list[int]) -> list:
    return [r.on_packet(MIDDLE, p, 100, False) for p in psns]


def test_a_late_packet_then_a_gap_counts_one_reordering():
    r = Responder(start_psn=10, ack_every=100)
    replies = feed(r, [10, 12, 11, 13])  # 11 overtaken by 12; 12 was discarded, so 13 is ahead
    assert replies[1] == (NAK_SEQ, 11)
    assert r.reordered == 1 and r.out_of_sequence == 2


def test_where_in_the_flow_the_reordering_came_is_kept():
    r = Responder(start_psn=0, ack_every=100)
    assert r.last_reordered_at == -1
    feed(r, [0, 2, 1, 3])  # at the flow's start: 1 overtaken by 2
    assert r.last_reordered_at == 2  # two packets accepted when it showed
    feed(r, [2, 3, *range(4, 40), 41, 40, 42])  # the resend, then 40 overtaken by 41
    assert r.reordered == 2 and r.last_reordered_at == 41


def test_a_late_packet_then_its_resend_counts_one_reordering():
    r = Responder(start_psn=10, ack_every=100)
    feed(r, [10, 12, 11, 11, 12])  # the last packet of a flow overtaken; go-back-N resends 11, 12
    assert r.reordered == 1 and r.duplicates == 1 and r.expected_psn == 13


def test_a_loss_filled_by_the_resend_counts_nothing():
    r = Responder(start_psn=10, ack_every=100)
    feed(r, [10, 12, 13, 11, 12, 13, 14])  # 11 lost; the resend 11, 12, 13 comes in order
    assert r.reordered == 0 and r.out_of_sequence == 2 and r.expected_psn == 15


def test_merged_runs_count_the_same():
    r = Responder(start_psn=10, ack_every=100)
    feed(r, [10, 12, 11])
    r.on_run(11, 3, 300)  # the resend from 11, merged: starts with a copy of the late packet
    assert r.reordered == 1 and r.expected_psn == 14


def test_over_a_wire_one_overtaken_packet_is_one_reordering_and_loss_is_none():
    sizes = (20_000,) * 3
    req, resp = pair(ack_every=4)
    for s in sizes:
        req.post(s)
    wire = Wire(req, resp)
    fired = []

    def sixth_packet_late() -> float:  # called for a data packet right after it joins wire.sent
        if len(wire.sent) == 6 and not fired:
            fired.append(True)
            return 30e-6  # a path 30 us longer
        return 0.0

    wire.jitter = sixth_packet_late
    wire.run()
    assert resp.messages == len(sizes) and resp.reordered == 1

    req, resp = pair(ack_every=4)
    for s in sizes:
        req.post(s)
    Wire(req, resp, drop_data=lambda p, i: i in (5, 17)).run()
    assert resp.messages == len(sizes) and resp.reordered == 0 and req.retransmitted > 0


def test_random_data_loss_is_never_counted_as_reordering():
    import random
    for seed in range(100):
        rng = random.Random(seed)
        req, resp = pair(ack_every=4)
        sizes = (30_000,) * 4
        for s in sizes:
            req.post(s)
        Wire(req, resp, drop_data=lambda p, i: rng.random() < 0.05).run()
        assert resp.messages == len(sizes) and resp.reordered == 0, seed
