"""The reordering responder (placement by PSN, for packet spraying), alone and against the
requester over the test wire of test_transport with jitter (reordering) and loss."""

from __future__ import annotations

import random

import pytest

from fabric_emu.wire import roce
from fabric_emu.nic.transport import ACK, PSN_MASK, ReorderingResponder, Requester
from tests.unit.test_transport import MTU, RTO, Wire

ONLY, FIRST = roce.RC_RDMA_WRITE_ONLY, roce.RC_RDMA_WRITE_FIRST
MIDDLE, LAST = roce.RC_RDMA_WRITE_MIDDLE, roce.RC_RDMA_WRITE_LAST


def test_a_shuffled_message_is_placed_by_psn_and_never_naked():
    r = ReorderingResponder(start_psn=10, ack_every=100)
    order = [(12, MIDDLE, False), (14, LAST, True), (10, FIRST, False), (13, MIDDLE, False),
             (11, MIDDLE, False)]
    replies = [r.on_packet(op, psn, 100, ackreq) for psn, op, ackreq in order]
    # nothing is acknowledged until the gap before the AckReq'd LAST fills; then one ACK of it
    assert replies == [None, None, None, None, (ACK, 14)]
    assert (r.packets, r.bytes, r.messages, r.msn) == (5, 500, 1, 1)
    assert (r.out_of_order, r.duplicates, r.naks_sent) == (3, 0, 0)
    assert r.expected_psn == 15


def test_duplicates_of_held_or_passed_packets_count_once_and_reack_on_ackreq():
    r = ReorderingResponder(start_psn=0)
    r.on_packet(MIDDLE, 2, 100, False)  # held
    assert r.on_packet(MIDDLE, 2, 100, False) is None  # the same again: a duplicate
    r.on_packet(FIRST, 0, 100, False)
    r.on_packet(MIDDLE, 1, 100, False)
    assert r.on_packet(FIRST, 0, 100, True) == (ACK, 2)  # behind, AckReq: cumulative re-ACK
    assert (r.packets, r.bytes, r.duplicates) == (3, 300, 2)


def test_packets_beyond_the_window_are_dropped_and_acks_coalesce():
    r = ReorderingResponder(start_psn=0, ack_every=4, window=8)
    assert r.on_packet(MIDDLE, 8, 100, False) is None and r.beyond_window == 1 and r.packets == 0
    replies = [r.on_packet(MIDDLE, psn, 100, False) for psn in range(8)]
    assert replies == [None, None, None, (ACK, 3), None, None, None, (ACK, 7)]


def test_psn_wraparound():
    start = PSN_MASK - 1
    r = ReorderingResponder(start_psn=start)
    r.on_packet(LAST, 1, 10, True)  # wrapped: 3 ahead
    r.on_packet(MIDDLE, 0, 10, False)
    r.on_packet(MIDDLE, PSN_MASK, 10, False)
    assert r.on_packet(FIRST, start, 10, False) == (ACK, 1)
    assert (r.messages, r.out_of_order, r.expected_psn) == (1, 3, 2)


def post_random(req: Requester, rng: random.Random, n: int, smallest: int) -> list[int]:
    sizes = [rng.randrange(smallest, 20 * MTU) for _ in range(n)]
    for size in sizes:
        req.post(size)
    return sizes


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sprayed_transfer_completes_without_retransmission(seed):
    """Heavy reordering (jitter of many packet times), no loss: every message completes, every
    byte arrives once, and nothing is sent again."""
    rng = random.Random(seed)
    req = Requester(0, MTU, rto_s=RTO)
    resp = ReorderingResponder(0)
    sizes = post_random(req, rng, 12, 0)
    Wire(req, resp, jitter=lambda: rng.uniform(0, 30e-6)).run()
    assert req.messages_done == len(sizes) and req.error is None
    assert (req.retransmitted, req.naks, req.timeouts) == (0, 0, 0)
    assert resp.bytes == sum(sizes) and resp.messages == len(sizes) and resp.out_of_order > 0


@pytest.mark.parametrize("seed", [4, 5])
def test_sprayed_transfer_with_loss_recovers_by_timeout(seed):
    rng = random.Random(seed)
    req = Requester(0, MTU, rto_s=RTO)
    resp = ReorderingResponder(0)
    sizes = post_random(req, rng, 8, 1)
    wire = Wire(req, resp, jitter=lambda: rng.uniform(0, 20e-6),
                drop_data=lambda p, i: rng.random() < 0.03)
    wire.run(max_time=10.0)
    assert req.messages_done == len(sizes) and req.error is None
    assert resp.bytes == sum(sizes) and resp.naks_sent == 0
    assert req.timeouts > 0 and req.retransmitted >= len(wire.dropped)
