"""RC go-back-N reliability: requester and responder driven against each other over a test wire."""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import random
from collections.abc import Callable

import pytest

from fabric_emu.wire import roce
from fabric_emu.nic.transport import (ACK, NAK_SEQ, PSN_MASK, Packet, Requester, Responder,
                                        psn_add, psn_diff)

ONLY, FIRST = roce.RC_RDMA_WRITE_ONLY, roce.RC_RDMA_WRITE_FIRST
MIDDLE, LAST = roce.RC_RDMA_WRITE_MIDDLE, roce.RC_RDMA_WRITE_LAST
MTU = 1000
RTO = 1e-3
COUNTERS = ("packets_sent", "retransmitted", "naks", "timeouts", "messages_done",
            "messages_sent", "bytes_sent", "bytes_acked", "error")


class Wire:
    """Event-driven loop: one packet per `gap`, `delay` each way, chosen drops and reordering.

    drop_data(packet, i) / drop_reply(syndrome, psn, i) decide the fate of the i-th data packet /
    reply put on the wire; jitter() adds delay per packet (reordering when it varies).
    """

    def __init__(self, req: Requester, resp: Responder, *, delay: float = 10e-6,
                 gap: float = 1e-6, drop_data: Callable[[Packet, int], bool] | None = None,
                 drop_reply: Callable[[int, int, int], bool] | None = None,
                 jitter: Callable[[], float] | None = None,
                 runs: Callable[[int], int] | None = None):
        self.req, self.resp = req, resp
        self.runs = runs  # how many of a peeked run to send at once (the NIC's sendmmsg); None: 1
        self.delay, self.gap = delay, gap
        self.drop_data = drop_data or (lambda p, i: False)
        self.drop_reply = drop_reply or (lambda s, psn, i: False)
        self.jitter = jitter or (lambda: 0.0)
        self.sent: list[Packet] = []  # copies of every data packet put on the wire
        self.dropped: list[Packet] = []
        self.replies: list[tuple[float, int, int]] = []  # (time, syndrome, psn) delivered
        self.replies_sent = 0
        self.completions: list[tuple[float, int]] = []  # (time, messages) from on_ack/on_nak
        self.hw_at_nak: list[int] = []  # the requester's high-water mark as each NAK arrived
        self._events: list[tuple[float, int, str, object]] = []
        self._seq = itertools.count()

    def _push(self, t: float, kind: str, item: object) -> None:
        heapq.heappush(self._events, (t, next(self._seq), kind, item))

    def run(self, max_time: float = 1.0) -> float:
        """Until nothing is left to send, outstanding or in flight; returns the end time."""
        req, now, next_tx = self.req, 0.0, 0.0
        while True:
            t_ev = self._events[0][0] if self._events else math.inf
            t_timer = req.deadline if req.deadline is not None else math.inf
            t_tx = max(next_tx, now) if req.has_work else math.inf
            t = min(t_ev, t_timer, t_tx)
            if t == math.inf:
                return now
            assert t < max_time, "the wire did not settle"
            now = t
            if t == t_ev:
                _, _, kind, item = heapq.heappop(self._events)
                if kind == "data":
                    self._to_responder(item, now)
                else:
                    self._to_requester(*item, now)
            elif t == t_timer:
                req.on_timer(now)
            else:
                self._transmit(now)
                next_tx = now + self.gap

    def _transmit(self, now: float) -> None:
        """Send the next packet, or (with runs) part of the next run; the packets of a run that
        survive in a row arrive together, as the NIC's receive path merges them."""
        head = self.req.peek()
        n = self.runs(head.count) if self.runs else 1
        pkts = [dataclasses.replace(head, psn=psn_add(head.psn, i), count=1) for i in range(n)]
        self.req.sent(now, n)
        group: list[Packet] = []
        for pkt in pkts:
            index = len(self.sent)
            self.sent.append(pkt)
            if self.drop_data(pkt, index):
                self.dropped.append(pkt)
                self._deliver(group, now)
                group = []
            else:
                group.append(pkt)
        self._deliver(group, now)

    def _deliver(self, group: list[Packet], now: float) -> None:
        if group:
            self._push(now + self.delay + self.jitter(), "data", group)

    def _to_responder(self, group: list[Packet], now: float) -> None:
        if len(group) == 1:
            pkt = group[0]
            reply = self.resp.on_packet(pkt.opcode, pkt.psn, pkt.data_len, pkt.ackreq)
        else:
            reply = self.resp.on_run(group[0].psn, len(group), sum(p.data_len for p in group))
        if reply is None:
            return
        index = self.replies_sent
        self.replies_sent += 1
        if not self.drop_reply(*reply, index):
            self._push(now + self.delay + self.jitter(), "reply", reply)

    def _to_requester(self, syndrome: int, psn: int, now: float) -> None:
        self.replies.append((now, syndrome, psn))
        before = self.req.messages_done
        if syndrome == ACK:
            assert self.req.on_ack(psn, now) == self.req.messages_done - before
        else:
            self.hw_at_nak.append(psn_add(self.req.una, self.req.outstanding))
            self.req.on_nak(psn, now)
        if self.req.messages_done > before:
            self.completions.append((now, self.req.messages_done - before))


def pair(start: int = 100, *, ack_every: int = 16, retry_limit: int = 7,
         sizes: tuple[int, ...] = ()) -> tuple[Requester, Responder]:
    req = Requester(start, MTU, RTO, retry_limit)
    for n in sizes:
        req.post(n)
    return req, Responder(start, ack_every)


def counters(req: Requester) -> dict:
    return {name: getattr(req, name) for name in COUNTERS}


def assert_all_delivered(req: Requester, resp: Responder, sizes: tuple[int, ...]) -> None:
    assert req.error is None
    assert req.messages_done == req.messages_sent == resp.messages == len(sizes)
    assert resp.msn == len(sizes)
    assert req.bytes_acked == resp.bytes == sum(sizes)
    assert resp.opcode_errors == 0
    assert req.idle and not req.has_work and req.deadline is None and req.peek() is None


# ---- PSN arithmetic ----

def test_psn_arithmetic_wraps_and_is_signed():
    assert psn_add(PSN_MASK, 1) == 0
    assert psn_add(PSN_MASK - 1, 5) == 3
    assert psn_diff(2, PSN_MASK) == 3
    assert psn_diff(PSN_MASK, 2) == -3
    assert psn_diff(5, 5) == 0
    assert psn_diff(1 << 23, 0) == 1 << 23  # the range is (-2**23, 2**23]
    assert psn_diff(0, 1 << 23) == 1 << 23
    assert psn_diff((1 << 23) + 1, 0) == -(1 << 23) + 1


# ---- (1) lossless ----

def test_lossless_messages_packets_and_coalesced_acks():
    start = 100
    sizes = (0, MTU, MTU + 1, 10 * MTU)
    req, resp = pair(start, ack_every=4, sizes=sizes)
    wire = Wire(req, resp)
    wire.run()
    assert_all_delivered(req, resp, sizes)
    assert [p.psn for p in wire.sent] == [start + i for i in range(14)]
    assert [p.opcode for p in wire.sent] == [ONLY, ONLY, FIRST, LAST, FIRST] + [MIDDLE] * 8 + [LAST]
    assert [p.data_len for p in wire.sent] == [0, MTU, MTU, 1] + [MTU] * 10
    assert [p.message_len for p in wire.sent] == [0, MTU, MTU + 1, MTU + 1] + [10 * MTU] * 10
    assert [i for i, p in enumerate(wire.sent) if p.ackreq] == [0, 1, 3, 13]  # message lasts
    assert not any(p.retransmit for p in wire.sent)
    # AckReq on 0, 1, 3, 13; coalescing (every 4th accepted packet since the last ACK) on 7, 11.
    assert [(s, psn - start) for _, s, psn in wire.replies] == [
        (ACK, 0), (ACK, 1), (ACK, 3), (ACK, 7), (ACK, 11), (ACK, 13)]
    assert resp.acks_sent == 6 and resp.naks_sent == 0
    assert (req.packets_sent, req.retransmitted, req.naks, req.timeouts) == (14, 0, 0, 0)
    assert req.bytes_sent == sum(sizes)
    assert sum(n for _, n in wire.completions) == 4


def test_peek_reuses_one_packet_and_does_not_commit():
    req, _ = pair(sizes=(2 * MTU,))
    first = req.peek()
    assert req.peek() is first and (first.opcode, first.psn) == (FIRST, 100)
    req.sent(0.0)
    assert req.peek() is first and (first.opcode, first.psn) == (LAST, 101)
    req.sent(0.0)
    assert req.peek() is None and not req.has_work
    with pytest.raises(RuntimeError):
        req.sent(0.0)
    assert req.deadline == RTO and req.outstanding == 2


# ---- (2) one data packet lost mid-message ----

def test_mid_message_loss_one_nak_and_go_back_n():
    start, lost = 100, 105
    sizes = (8 * MTU,) * 5 + (MTU + 1,)
    req, resp = pair(start, sizes=sizes)
    wire = Wire(req, resp, drop_data=lambda p, i: p.psn == lost and not p.retransmit)
    wire.run()
    assert_all_delivered(req, resp, sizes)
    assert [(s, psn) for _, s, psn in wire.replies if s == NAK_SEQ] == [(NAK_SEQ, lost)]
    assert req.naks == resp.naks_sent == 1 and req.timeouts == 0
    (hw,) = wire.hw_at_nak
    assert 0 < psn_diff(hw, lost) < 42  # the NAK came back mid-stream
    assert req.retransmitted == psn_diff(hw, lost)
    assert resp.out_of_sequence == psn_diff(hw, lost) - 1 and resp.duplicates == 0
    psns = [p.psn for p in wire.sent]
    assert psns == list(range(start, hw)) + list(range(lost, start + 42))
    again = wire.sent[hw - start]
    assert again.psn == lost and again.retransmit and again.ackreq and again.opcode == MIDDLE


# ---- (3) tail loss ----

def test_tail_loss_is_recovered_by_the_rto_only():
    sizes = (3 * MTU, 2 * MTU + 500)
    req, resp = pair(sizes=sizes)
    tail = 105
    wire = Wire(req, resp, drop_data=lambda p, i: p.psn == tail and not p.retransmit)
    end = wire.run()
    assert_all_delivered(req, resp, sizes)
    assert req.timeouts == 1 and req.naks == 0 and resp.naks_sent == 0
    # Only LASTs ask for ACKs, so una is the second message's FIRST: go back N from there.
    retx = [(p.psn, p.opcode, p.ackreq) for p in wire.sent if p.retransmit]
    assert retx == [(103, FIRST, True), (104, MIDDLE, False), (tail, LAST, True)]
    assert resp.duplicates == 2 and req.packets_sent == 9
    assert [n for _, n in wire.completions] == [1, 1]
    assert wire.completions[1][0] > RTO  # only after the deadline
    assert end == wire.completions[1][0]


# ---- (4) ACK loss ----

def test_lost_acks_rto_rewinds_and_duplicates_are_reacked():
    sizes = (2 * MTU,) * 3
    req, resp = pair(sizes=sizes)
    wire = Wire(req, resp, drop_reply=lambda s, psn, i: i < 3)  # every ACK of the first pass
    wire.run()
    assert_all_delivered(req, resp, sizes)
    assert req.timeouts == 1 and req.naks == 0
    retx = [p for p in wire.sent if p.retransmit]
    assert retx[0].psn == 100 and retx[0].ackreq and retx[0].opcode == FIRST
    assert resp.packets == 6 and resp.duplicates == len(retx)
    assert wire.replies[0][1:] == (ACK, 105)  # the duplicate's re-ACK covers everything
    assert wire.completions == [(wire.replies[0][0], 3)]


def test_late_ack_after_a_timeout_moves_the_send_cursor_ahead():
    req, _ = pair(sizes=(5 * MTU,))
    for _ in range(5):
        req.sent(0.0)
    req.on_timer(RTO)
    assert req.timeouts == 1 and req.peek().psn == 100 and req.peek().ackreq
    assert req.on_ack(102, RTO + 1e-6) == 0
    p = req.peek()
    assert (p.psn, p.opcode, p.retransmit, p.ackreq) == (103, MIDDLE, True, True)
    assert req.bytes_acked == 3 * MTU
    assert req.deadline == pytest.approx(2 * RTO + 1e-6)


# ---- (5) retry limit ----

def test_retry_limit_exceeded_sets_error_and_stops():
    req, resp = pair(retry_limit=3, sizes=(2 * MTU,))
    wire = Wire(req, resp, drop_data=lambda p, i: True)
    end = wire.run()
    assert req.timeouts == 4 and req.error and "retry" in req.error
    assert end == pytest.approx(4 * RTO, rel=0.01)
    assert not req.has_work and req.peek() is None and req.deadline is None
    assert req.messages_done == 0 and resp.packets == 0
    req.on_timer(10.0)
    assert req.timeouts == 4


def test_retry_count_resets_on_progress():
    req, _ = pair(retry_limit=2, sizes=(MTU, MTU))
    req.sent(0.0)
    req.sent(0.0)
    for t in (1, 2):
        req.on_timer(t * RTO)
        req.sent(t * RTO)
        req.sent(t * RTO)
    assert req.error is None and req.timeouts == 2
    assert req.on_ack(100, 2.5 * RTO) == 1  # progress: the count starts again
    for t in (4, 5):
        req.on_timer(t * RTO)
        req.sent(t * RTO)
    assert req.error is None
    req.on_timer(6 * RTO)
    assert req.error is not None and req.timeouts == 5


def test_timer_before_deadline_or_when_idle_does_nothing():
    req, _ = pair(sizes=(MTU,))
    req.on_timer(5.0)
    req.sent(0.0)
    req.on_timer(RTO / 2)
    assert req.timeouts == 0 and req.peek() is None
    assert req.on_ack(100, 1e-5) == 1 and req.deadline is None
    req.on_timer(5.0)
    assert req.timeouts == 0


# ---- (6) PSN wraparound ----

def test_psn_wraparound_with_a_loss_across_the_wrap():
    start = PSN_MASK - 2
    sizes = (3 * MTU, MTU, 4 * MTU)
    req, resp = pair(start, sizes=sizes)
    wire = Wire(req, resp, drop_data=lambda p, i: p.psn == 1 and not p.retransmit)
    wire.run()
    assert_all_delivered(req, resp, sizes)
    assert [p.psn for p in wire.sent[:8]] == [PSN_MASK - 2, PSN_MASK - 1, PSN_MASK, 0, 1, 2, 3, 4]
    assert [p.opcode for p in wire.sent[:4]] == [FIRST, MIDDLE, LAST, ONLY]
    assert req.naks == 1 and [p.psn for p in wire.sent[8:]] == [1, 2, 3, 4]
    assert resp.expected_psn == 5 and req.una == 5


# ---- (7) stale and duplicate feedback ----

def test_stale_and_duplicate_naks_and_acks_are_ignored():
    req, _ = pair(sizes=(MTU, MTU, 8 * MTU))  # PSNs 100, 101, 102..109
    for _ in range(10):
        req.sent(0.0)
    req.on_nak(103, 1e-5)  # implicit ACK of 100..102 completes two messages
    assert (req.naks, req.messages_done, req.una, req.bytes_acked) == (1, 2, 103, 3 * MTU)
    p = req.peek()
    assert (p.psn, p.retransmit, p.ackreq, p.opcode) == (103, True, True, MIDDLE)
    req.sent(2e-5)
    req.sent(2e-5)
    snapshot = counters(req)
    for psn in (103, 102, 50, 111, 200):  # duplicate, acknowledged, far behind, beyond sent
        req.on_nak(psn, 3e-5)
    for psn in (101, 102, 110, 5000):  # acknowledged, no progress, beyond sent, beyond sent
        assert req.on_ack(psn, 3e-5) == 0
    assert counters(req) == snapshot and req.peek().psn == 105
    for _ in range(5):  # the retransmission passes the old high-water mark ...
        req.sent(4e-5)
    req.on_nak(103, 5e-5)  # ... so the same NAK is news again (the retransmission was lost)
    assert req.naks == 2 and req.peek().psn == 103


def test_nak_racing_a_timeout_does_not_rewind_twice():
    req, _ = pair(sizes=(4 * MTU,))
    for _ in range(4):
        req.sent(0.0)
    req.on_timer(RTO)
    req.sent(RTO)
    req.sent(RTO)
    req.on_nak(100, RTO + 1e-6)  # sent by the responder before the timeout
    assert req.naks == 0 and req.peek().psn == 102


# ---- (8) randomized loss ----

@pytest.mark.parametrize("seed,reorder,runs", [(1, False, False), (2, False, False),
                                               (3, True, False), (4, False, True),
                                               (5, True, True)])
def test_random_loss_every_message_completes(seed, reorder, runs):
    rng = random.Random(seed)
    sizes = tuple(rng.choice((0, 1, MTU - 1, MTU, MTU + 1)) if rng.random() < 0.3
                  else rng.randrange(1, 12 * MTU) for _ in range(120))
    req, resp = pair(rng.randrange(PSN_MASK + 1), ack_every=4, sizes=sizes)
    wire = Wire(req, resp, drop_data=lambda p, i: rng.random() < 0.05,
                drop_reply=lambda s, psn, i: rng.random() < 0.05,
                jitter=(lambda: rng.random() * 2e-6) if reorder else None,
                runs=(lambda count: rng.randint(1, count)) if runs else None)
    wire.run()
    assert_all_delivered(req, resp, sizes)
    assert len(wire.dropped) > 10
    assert req.retransmitted >= len(wire.dropped)
    assert req.packets_sent == len(wire.sent) == resp.packets + resp.duplicates \
        + resp.out_of_sequence + len(wire.dropped)
    assert req.bytes_sent == sum(p.data_len for p in wire.sent)


# ---- responder alone ----

def test_responder_naks_once_per_episode_and_reacks_duplicates():
    resp = Responder(10, ack_every=100)
    assert resp.on_packet(FIRST, 10, MTU, False) is None
    assert resp.on_packet(MIDDLE, 12, MTU, False) == (NAK_SEQ, 11)
    assert resp.on_packet(MIDDLE, 13, MTU, False) is None  # same episode
    assert resp.on_packet(LAST, 14, 5, True) is None
    assert resp.on_packet(FIRST, 10, MTU, False) is None  # duplicate, no AckReq
    assert resp.on_packet(FIRST, 10, MTU, True) == (ACK, 10)
    assert resp.on_packet(MIDDLE, 11, MTU, False) is None  # episode over
    assert resp.on_packet(LAST, 13, 5, False) == (NAK_SEQ, 12)  # a new episode
    assert (resp.packets, resp.bytes, resp.messages, resp.msn) == (2, 2 * MTU, 0, 0)
    assert (resp.out_of_sequence, resp.duplicates, resp.naks_sent, resp.acks_sent) == (4, 2, 2, 1)
    assert resp.on_packet(MIDDLE, 12, MTU, False) is None
    assert resp.on_packet(LAST, 13, 5, False) is None
    assert resp.on_packet(ONLY, 14, 0, True) == (ACK, 14)
    assert (resp.messages, resp.msn, resp.bytes) == (2, 2, 3 * MTU + 5)


def test_responder_coalesces_acks():
    resp = Responder(0, ack_every=3)
    replies = [resp.on_packet(MIDDLE if i else FIRST, i, MTU, False) for i in range(7)]
    assert replies == [None, None, (ACK, 2), None, None, (ACK, 5), None]
    assert resp.on_packet(LAST, 7, 1, True) == (ACK, 7)  # AckReq resets the count
    assert resp.on_packet(ONLY, 8, 1, False) is None


def test_responder_counts_opcode_errors_and_resyncs():
    resp = Responder(PSN_MASK)
    resp.on_packet(MIDDLE, PSN_MASK, MTU, False)  # no FIRST: ignored for messages
    resp.on_packet(LAST, 0, 1, False)
    resp.on_packet(FIRST, 1, MTU, False)
    resp.on_packet(ONLY, 2, 1, False)  # FIRST's message abandoned, this one completes
    resp.on_packet(roce.RC_SEND_ONLY, 3, 1, False)
    assert (resp.opcode_errors, resp.messages, resp.packets, resp.expected_psn) == (4, 1, 5, 4)


def test_argument_checks():
    with pytest.raises(ValueError):
        Requester(0, MTU, RTO).post(-1)
    with pytest.raises(ValueError):
        Requester(0, 0, RTO)
    with pytest.raises(ValueError):
        Responder(0, ack_every=0)


# ---- runs: the NIC sends and receives MIDDLE packets a run at a time ----

def test_peek_offers_runs_of_middles_bounded_by_window_and_high_water():
    req = Requester(PSN_MASK - 2, MTU, RTO, max_outstanding=6)  # a run across the PSN wrap
    req.post(10 * MTU)
    p = req.peek()
    assert (p.opcode, p.count) == (FIRST, 1)
    req.sent(0.0)
    p = req.peek()
    assert (p.opcode, p.psn, p.count) == (MIDDLE, PSN_MASK - 1, 5)  # the window: 6 outstanding
    req.sent(0.0, 3)
    assert req.peek().count == 2 and req.peek().psn == 1
    with pytest.raises(ValueError):
        req.sent(0.0, 3)
    req.sent(0.0, 2)
    assert req.peek() is None  # window full
    req.on_ack(psn_add(PSN_MASK - 2, 1), 0.0)  # FIRST and one MIDDLE acknowledged
    req.on_nak(psn_add(PSN_MASK - 2, 3), 0.0)  # the rest from PSN 0 again
    p = req.peek()
    assert (p.psn, p.retransmit, p.ackreq, p.count) == (0, True, True, 1)  # AckReq: alone
    req.sent(0.0)
    p = req.peek()
    assert (p.psn, p.retransmit, p.count) == (1, True, 2)  # resends stop at the high-water mark
    req.sent(0.0, 2)
    p = req.peek()
    assert (p.psn, p.retransmit, p.count) == (3, False, 3)  # the window again: 6 from una 0
    assert (req.packets_sent, req.retransmitted, req.bytes_sent) == (9, 3, 9 * MTU)


def test_a_run_counts_as_its_packets_one_by_one():
    def drive(step: int) -> dict:
        req = Requester(5, MTU, RTO)
        for n in (40 * MTU + 7, 3 * MTU, 1):
            req.post(n)
        while (p := req.peek()) is not None:
            req.sent(1.0, min(step, p.count))
        return {**counters(req), "next": req.next_psn, "deadline": req.deadline}

    assert drive(1) == drive(7) == drive(10_000)


@pytest.mark.parametrize("seed", range(4))
def test_responder_on_run_matches_packet_by_packet(seed):
    """Runs of MIDDLEs at, ahead of, behind and across the expected PSN: the same state and
    counters as the packets one by one (ACKs may sit later within a run, never fewer NAKs)."""
    rng = random.Random(seed)
    start = rng.randrange(PSN_MASK + 1)
    one, runs = Responder(start, ack_every=4), Responder(start, ack_every=4)
    for r in (one, runs):
        r.on_packet(FIRST, start, MTU, False)
    for _ in range(300):
        psn = psn_add(one.expected_psn, rng.randint(-6, 3))
        count = rng.randint(1, 9)
        for i in range(count):
            one.on_packet(MIDDLE, psn_add(psn, i), MTU, False)
        runs.on_run(psn, count, count * MTU)
        fields = ("expected_psn", "packets", "bytes", "duplicates", "out_of_sequence",
                  "naks_sent", "opcode_errors", "messages")
        assert {f: getattr(runs, f) for f in fields} == {f: getattr(one, f) for f in fields}
