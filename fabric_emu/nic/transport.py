"""InfiniBand RC reliability for RDMA WRITE traffic: go-back-N requester and responder.

Pure state machines, no sockets and no clocks (every time is passed in as `now`), so the NIC
loop drives them and unit tests can replay any loss pattern exactly. The behaviour follows what
RoCE NICs do (IB spec vol. 1, ch. 9.7): the responder accepts only the expected PSN, NAKs the
first gap of a sequence-error episode once and re-ACKs duplicates that ask for it; the
requester retransmits everything from the NAKed PSN (go back N) or, when nothing answers for
rto_s, from the oldest unacknowledged PSN, giving up after retry_limit fruitless retries.

PSNs are 24-bit and wrap: compare them only through psn_diff(), which is valid while fewer than
2**23 PSNs are outstanding (the requester never lets more be).
"""

from __future__ import annotations

from dataclasses import dataclass

from fabric_emu.wire import roce

PSN_MASK = roce.PSN_MASK
_PSN_SPACE = PSN_MASK + 1
_HALF_PSN_SPACE = _PSN_SPACE >> 1
# The most PSNs that may be in flight: beyond half the space, "ahead" and "behind" are ambiguous.
MAX_OUTSTANDING = _HALF_PSN_SPACE - 1

# AETH syndromes the responder answers with.
ACK = 0x1F  # ACK, no end-to-end credit count (RoCE does not use credits for RC WRITEs)
NAK_SEQ = 0x60  # NAK, PSN sequence error

_ONLY = roce.RC_RDMA_WRITE_ONLY
_FIRST = roce.RC_RDMA_WRITE_FIRST
_MIDDLE = roce.RC_RDMA_WRITE_MIDDLE
_LAST = roce.RC_RDMA_WRITE_LAST
_STARTS = frozenset({_FIRST, _ONLY})
_ENDS = frozenset({_LAST, _ONLY})
_CONTINUES = frozenset({_MIDDLE, _LAST})


def psn_add(a: int, n: int) -> int:
    """a + n in the 24-bit PSN space."""
    return (a + n) & PSN_MASK


def psn_diff(a: int, b: int) -> int:
    """a - b as a signed distance in (-2**23, 2**23]: how far a is ahead of b."""
    d = (a - b) & PSN_MASK
    return d - _PSN_SPACE if d > _HALF_PSN_SPACE else d


@dataclass(slots=True)
class Packet:
    """What the requester wants to put on the wire next (see Requester.peek)."""

    opcode: int  # roce.RC_RDMA_WRITE_FIRST/MIDDLE/LAST/ONLY
    psn: int
    data_len: int  # payload bytes of this packet
    ackreq: bool  # BTH AckReq bit
    message_len: int  # DMA length of the message (the RETH's, used on FIRST/ONLY)
    retransmit: bool  # True when this PSN was sent before
    count: int = 1  # packets from psn on that share all of the above (a run of MIDDLEs)


class Requester:
    """Requester side of an RC QP: WRITE messages cut into MTU packets, go-back-N recovery.

    Payloads are never stored (the emulated data is zeros): the unacknowledged messages are kept
    as (first PSN, bytes, packets), and any PSN maps back to its message and offset. Three PSNs
    drive everything: una (oldest unacknowledged), next (the next to send, rewound on loss) and
    the high-water mark (one past the highest ever sent), with una <= next <= high-water.
    """

    def __init__(self, start_psn: int, mtu: int, rto_s: float, retry_limit: int = 7, *,
                 max_outstanding: int = MAX_OUTSTANDING):
        if mtu <= 0:
            raise ValueError(f"mtu must be positive, got {mtu}")
        if rto_s <= 0:
            raise ValueError(f"rto_s must be positive, got {rto_s}")
        if retry_limit < 0:
            raise ValueError(f"retry_limit must be >= 0, got {retry_limit}")
        if not 0 < max_outstanding <= MAX_OUTSTANDING:
            raise ValueError(f"max_outstanding must be in 1..{MAX_OUTSTANDING}")
        start = start_psn & PSN_MASK
        self.mtu = mtu
        self.rto_s = rto_s
        self.retry_limit = retry_limit
        self.max_outstanding = max_outstanding
        # (first PSN, bytes, packets) of every message not yet fully acknowledged, from _head on;
        # a list with a moving head (compacted now and then) indexes in O(1), unlike a deque.
        self._msgs: list[tuple[int, int, int]] = []
        self._head = 0
        self._cur = 0  # index in _msgs of the message holding _next
        self._cur_pkt = 0  # packet index of _next within that message
        self._una = start
        self._next = start
        self._hw = start  # one past the highest PSN ever sent
        self._end = start  # one past the last PSN posted
        self._deadline: float | None = None
        self._restart_timer = False  # restart the RTO at the first packet sent after a rewind
        self._ackreq = False  # the next packet is the first after a rewind: it asks for an ACK
        self._rewind_psn = -1  # where the last rewind went (-1: none pending), ...
        self._rewind_hw = start  # ... and the high-water mark then: the duplicate-NAK guard
        self._retries = 0  # consecutive timeouts without ACK progress
        self._packet = Packet(_ONLY, start, 0, False, 0, False)
        self._last = False  # _packet is the last of its message
        self._fresh = False  # _packet describes _next (cleared by anything that moves _next)
        self.packets_sent = self.retransmitted = self.naks = self.timeouts = 0
        self.messages_done = self.messages_sent = 0
        self.bytes_sent = self.bytes_acked = 0
        self.error: str | None = None

    # ---- posting and sending (the hot path) ----

    def post(self, nbytes: int) -> None:
        """Queue one WRITE message; a 0-byte message is a single WRITE_ONLY without data."""
        if nbytes < 0:
            raise ValueError(f"message length must be >= 0, got {nbytes}")
        packets = max(1, -(-nbytes // self.mtu))
        if packets > MAX_OUTSTANDING:  # offsets within a message must stay unambiguous
            raise ValueError(f"a {nbytes} B message needs more than {MAX_OUTSTANDING} PSNs")
        self._msgs.append((self._end, nbytes, packets))
        self._end = (self._end + packets) & PSN_MASK

    @property
    def has_work(self) -> bool:
        """A packet may be sent now (posted data left, window open, no fatal error)."""
        return (self._next != self._end and self.error is None
                and (self._next - self._una) & PSN_MASK < self.max_outstanding)

    def peek(self) -> Packet | None:
        """The next packet to send, without committing to it; None when there is none.

        To keep the hot path allocation-free this returns the same Packet object every time,
        updated in place: it is valid until the next call of sent(), on_ack(), on_nak() or
        on_timer(). Copy it (dataclasses.replace) to keep it longer.
        """
        if not self._fresh:
            if not self.has_work:
                return None
            self._fill()
        return self._packet

    def _fill(self) -> None:
        _first, nbytes, n = self._msgs[self._cur]
        k = self._cur_pkt
        p = self._packet
        if n == 1:
            p.opcode, p.data_len, last = _ONLY, nbytes, True
        elif k == 0:
            p.opcode, p.data_len, last = _FIRST, self.mtu, False
        elif k == n - 1:
            p.opcode, p.data_len, last = _LAST, nbytes - k * self.mtu, True
        else:
            p.opcode, p.data_len, last = _MIDDLE, self.mtu, False
        nxt = self._next
        p.psn = nxt
        p.ackreq = last or self._ackreq
        p.message_len = nbytes
        p.retransmit = nxt != self._hw  # next <= high-water, so != means behind it
        if p.opcode == _MIDDLE and not p.ackreq:
            # The MIDDLEs after this one, up to the window's edge and, when resending, up to the
            # high-water mark (so every packet of the run is a retransmission, or none is).
            count = min(n - 1 - k, self.max_outstanding - ((nxt - self._una) & PSN_MASK))
            if p.retransmit:
                count = min(count, (self._hw - nxt) & PSN_MASK)
            p.count = count
        else:
            p.count = 1
        self._last = last
        self._fresh = True

    def sent(self, now: float, n: int = 1) -> None:
        """The first n packets of the peeked run went to the kernel: account them and move on.

        n may be anything from 1 to the run's count (a socket may take only part of a run).
        """
        if not self._fresh and self.peek() is None:
            raise RuntimeError("sent() without a packet to send")
        p = self._packet
        if not 1 <= n <= p.count:
            raise ValueError(f"sent {n} packets of a run of {p.count}")
        nxt = (self._next + n) & PSN_MASK
        if self._restart_timer or self._una == self._hw:  # first outstanding or retransmitted
            self._deadline = now + self.rto_s
            self._restart_timer = False
        self.packets_sent += n
        self.bytes_sent += p.data_len * n
        if p.retransmit:
            self.retransmitted += n
        else:
            self._hw = nxt
            if self._last:
                self.messages_sent += 1
        self._next = nxt
        self._ackreq = False
        k = self._cur_pkt + n
        if k == self._msgs[self._cur][2]:
            self._cur += 1
            self._cur_pkt = 0
        else:
            self._cur_pkt = k
        self._fresh = False

    # ---- feedback ----

    def on_ack(self, psn: int, now: float) -> int:
        """Cumulative ACK of every PSN up to psn; returns the messages it completed.

        A stale ACK (nothing new, or beyond what was ever sent) changes and counts nothing.
        """
        new_una = (psn + 1) & PSN_MASK
        d = psn_diff(new_una, self._una)
        if d <= 0 or d > psn_diff(self._hw, self._una):
            return 0
        return self._acked(new_una, now)

    def on_nak(self, psn: int, now: float) -> None:
        """NAK (PSN sequence error): the responder expects psn. Implicit ACK, then go back N.

        Ignored when stale (psn already acknowledged or never sent), and when it repeats the
        PSN of the last rewind while the retransmission is still inside the range that was in
        flight at that rewind: packets sent before the rewind (or the NAK that raced a timeout)
        can produce it, and rewinding again would only resend the same packets once more. If
        the retransmission itself was lost, the RTO recovers it, as on hardware (the responder
        NAKs once per sequence-error episode anyway).
        """
        d = psn_diff(psn, self._una)
        if d < 0 or d > psn_diff(self._hw, self._una):
            return
        if psn == self._rewind_psn and psn_diff(self._next, self._rewind_hw) < 0:
            return
        self.naks += 1
        if d:
            self._acked(psn, now)
        self._rewind()

    def on_timer(self, now: float) -> None:
        """The RTO expired (call when now >= deadline): go back to una, or give up.

        The (retry_limit + 1)-th consecutive timeout without ACK progress sets `error` and stops
        the requester, as an IB QP with retry_cnt = retry_limit moves to the error state.
        Calls before the deadline, or with nothing outstanding, do nothing.
        """
        if self._deadline is None or now < self._deadline or self.error is not None:
            return
        self.timeouts += 1
        self._retries += 1
        if self._retries > self.retry_limit:
            self.error = (f"transport retry limit exceeded: {self._retries} timeouts without "
                          f"progress at PSN {self._una:#08x}")
            self._deadline = None
            self._fresh = False
            return
        self._rewind()
        self._deadline = now + self.rto_s

    def hold(self, now: float) -> None:
        """The NIC has not finished transmitting what it was given (a pause, a slow rate class):
        restart the timer instead of timing out. A NIC starts the timer when a packet leaves,
        not when it is queued, so a paused sender never times out on its own queue."""
        if self._deadline is not None and self.error is None:
            self._deadline = now + self.rto_s

    @property
    def deadline(self) -> float | None:
        """When on_timer must be called; None while nothing is outstanding (or after error)."""
        return self._deadline

    # ---- state for the NIC and for tests ----

    @property
    def una(self) -> int:
        """The oldest unacknowledged PSN."""
        return self._una

    @property
    def next_psn(self) -> int:
        """The PSN the next packet will carry."""
        return self._next

    @property
    def outstanding(self) -> int:
        """PSNs sent and not yet acknowledged."""
        return (self._hw - self._una) & PSN_MASK

    @property
    def idle(self) -> bool:
        """Every posted message is acknowledged."""
        return self._una == self._end

    # ---- internals ----

    def _acked(self, new_una: int, now: float) -> int:
        """Acknowledge [una, new_una) (validated by the caller); returns messages completed."""
        msgs, mtu, head = self._msgs, self.mtu, self._head
        una = self._una
        left = (new_una - una) & PSN_MASK
        acked_bytes = done = 0
        while left:
            first, nbytes, n = msgs[head]
            k = (una - first) & PSN_MASK  # packets of this message acknowledged before
            take = min(left, n - k)
            acked_bytes += min((k + take) * mtu, nbytes) - k * mtu
            left -= take
            una = (una + take) & PSN_MASK
            if k + take == n:
                head += 1
                done += 1
        self._una = new_una
        self.bytes_acked += acked_bytes
        self.messages_done += done
        self._retries = 0
        outstanding = new_una != self._hw and self.error is None
        self._deadline = now + self.rto_s if outstanding else None
        if self._rewind_psn >= 0 and psn_diff(new_una, self._rewind_psn) > 0:
            self._rewind_psn = -1
        if head > 64 and 2 * head > len(msgs):  # compact: amortised O(1) per message
            del msgs[:head]
            self._cur -= head
            head = 0
        self._head = head
        if psn_diff(self._next, new_una) < 0:  # acknowledged beyond a rewound cursor: skip ahead
            self._seek_una()
        return done

    def _rewind(self) -> None:
        """Go back N: the next packet is una again, and it asks for an ACK."""
        self._seek_una()
        self._ackreq = True
        self._rewind_psn = self._una
        self._rewind_hw = self._hw
        self._restart_timer = True

    def _seek_una(self) -> None:
        """Point the send cursor at una (always in the head message, if any is left)."""
        self._next = self._una
        self._cur = self._head
        if self._head < len(self._msgs):
            self._cur_pkt = (self._una - self._msgs[self._head][0]) & PSN_MASK
        else:
            self._cur_pkt = 0
        self._fresh = False


class _Acking:
    """What both responders share: sending an ACK restarts the coalescing count."""

    _unacked: int
    acks_sent: int

    def _ack(self, psn: int) -> tuple[int, int]:
        self._unacked = 0
        self.acks_sent += 1
        return ACK, psn & PSN_MASK


class Responder(_Acking):
    """Responder side of an RC QP: in-order acceptance, NAK on gaps, coalesced ACKs.

    on_packet returns the reply to send as (syndrome, PSN), with syndrome ACK or NAK_SEQ, and
    `msn` is the AETH message sequence number to put next to it.
    """

    def __init__(self, start_psn: int, ack_every: int = 16):
        if ack_every < 1:
            raise ValueError(f"ack_every must be >= 1, got {ack_every}")
        self.ack_every = ack_every
        self.expected_psn = start_psn & PSN_MASK
        self.msn = 0  # completed messages, 24 bits (AETH MSN)
        self._nak_sent = False  # in a sequence-error episode, its one NAK already sent
        # The last packet accepted ended a sequence-error episode: if the next one is again out
        # of sequence, or a copy of it, the gap was filled by a late packet, not by the resend.
        self._filled_gap = False
        self._naked_psn = -1  # the PSN the last NAK asked for; a second copy of it means it was late
        self._ahead_max = self.expected_psn  # the highest PSN that arrived ahead of a gap
        self._unacked = 0  # packets accepted since the last ACK (or NAK, which also acks)
        self._open = False  # a message's FIRST was accepted and its LAST not yet
        self.packets = self.bytes = self.messages = 0
        self.duplicates = self.out_of_sequence = self.opcode_errors = 0
        # Sequence errors a late packet filled (reordering, not loss). Exact when only data is
        # lost; a timeout that resends a NAKed packet already delivered also counts (lost ACKs).
        self.reordered = 0
        self.last_reordered_at = -1  # packets accepted when the latest reordering was counted
        self.acks_sent = self.naks_sent = 0

    def on_packet(self, opcode: int, psn: int, data_len: int,
                  ackreq: bool) -> tuple[int, int] | None:
        """Process one RC WRITE packet; the (syndrome, PSN) reply to send, or None."""
        if psn == self.expected_psn:  # the common case first: no distance to compute
            d = 0
        else:
            d = psn_diff(psn, self.expected_psn)
        if d > 0:  # ahead: packets were lost (or are late); discard, NAK once per episode
            self.out_of_sequence += 1
            # After a late fill the original stream goes on beyond every PSN seen; after a fill
            # by the resend, the next gap is a resend lost again (a PSN seen before).
            new = psn_diff(psn, self._ahead_max) > 0
            if new:
                self._ahead_max = psn
            if self._nak_sent:
                return None
            # A gap right after a late fill is its consequence (the packets that overtook the
            # late one were discarded): counted there, so its resends are not counted again.
            self._naked_psn = -1 if new and self._late_fill() else self.expected_psn
            self._nak_sent = True
            self._unacked = 0
            self.naks_sent += 1
            return NAK_SEQ, self.expected_psn
        if d < 0:  # behind: a retransmission of something already accepted
            self.duplicates += 1
            if psn == self._naked_psn:  # the resend filled the gap and then the original came
                self._count_reordering()
                self._naked_psn = -1
            elif psn_diff(psn, self.expected_psn) == -1:
                self._late_fill()
            return self._ack(self.expected_psn - 1) if ackreq else None
        self.expected_psn = (psn + 1) & PSN_MASK
        self._filled_gap = self._nak_sent  # two stores, no branch: this is the per-packet path
        self._nak_sent = False
        self.packets += 1
        self.bytes += data_len
        self._on_opcode(opcode)
        self._unacked += 1
        if ackreq or self._unacked >= self.ack_every:
            return self._ack(psn)
        return None

    def _late_fill(self) -> bool:
        """Called on a sequence error or a copy of the last packet accepted: if that packet had
        just filled a NAKed gap, it was the late original, not the resend (a resend is followed
        by the rest of the resend, in order), so count one reordering. The other way a late
        packet shows: it comes after the resend, as a copy of the NAKed PSN (on_packet).
        A loss is neither: its gap is filled once, by the resend."""
        if not self._filled_gap:
            return False
        self._count_reordering()
        self._filled_gap = False
        self._naked_psn = -1
        return True

    def _count_reordering(self) -> None:
        """One reordering, and where in the flow it came (a new flow's first packets can be
        reordered by a datapath that sets the flow up while they wait: results.trust)."""
        self.reordered += 1
        self.last_reordered_at = self.packets

    def on_run(self, psn: int, count: int, data_bytes: int) -> tuple[int, int] | None:
        """Process `count` WRITE MIDDLE packets with consecutive PSNs from psn, none asking for
        an ACK, data_bytes in all: what on_packet would do for each of them, in one step. The
        one difference: where on_packet would ACK somewhere inside the run (every ack_every
        packets), this ACKs the run's last PSN instead, acknowledging more, no later."""
        if count == 1:
            return self.on_packet(_MIDDLE, psn, data_bytes, False)
        d = 0 if psn == self.expected_psn else psn_diff(psn, self.expected_psn)
        if d < 0:  # starts with duplicates (a go-back-N resend); the rest may be new
            dup = min(count, -d)
            self.duplicates += dup
            if self._naked_psn >= 0 and 0 <= psn_diff(self._naked_psn, psn) < dup:
                self._count_reordering()
                self._naked_psn = -1
            elif -d <= count:  # the run holds a copy of the last packet accepted
                self._late_fill()
            if dup == count:
                return None
            per = data_bytes // count
            return self.on_run(self.expected_psn, count - dup, data_bytes - per * dup)
        if d > 0:  # all beyond a gap: one NAK per episode
            reply = self.on_packet(_MIDDLE, psn, 0, False)
            self.out_of_sequence += count - 1
            return reply
        self.expected_psn = (psn + count) & PSN_MASK
        self._filled_gap = self._nak_sent
        self._nak_sent = False
        self.packets += count
        self.bytes += data_bytes
        if not self._open:  # MIDDLEs outside a message, as _on_opcode counts them
            self.opcode_errors += count
        self._unacked += count
        if self._unacked >= self.ack_every:
            return self._ack(self.expected_psn - 1)
        return None

    def _on_opcode(self, opcode: int) -> None:
        """Message boundaries; a broken opcode sequence is counted and resynced, never fatal.

        A FIRST/ONLY while a message is open abandons it (uncompleted) and starts a new one; a
        MIDDLE/LAST (or any other opcode) outside a message is counted and otherwise ignored.
        """
        if opcode in _STARTS:
            if self._open:
                self.opcode_errors += 1
            self._open = True
        elif opcode not in _CONTINUES or not self._open:
            self.opcode_errors += 1
            return
        if opcode in _ENDS:
            self._open = False
            self.messages += 1
            self.msn = (self.msn + 1) & PSN_MASK


class ReorderingResponder(_Acking):
    """Responder for packet spraying: places packets by PSN, as NICs with out-of-order support do.

    Packets of one QP may take different paths and arrive out of order. A packet up to `window`
    PSNs ahead of the expected one is accepted and counted (its bytes are placed by PSN, so
    they count at once) and the expected PSN advances over every packet already held; nothing
    is NAKed because of reordering. A packet that is really lost keeps the expected PSN where it
    is until the requester's timer resends it (a NAK cannot tell loss from a late packet here).
    ACKs are cumulative (expected - 1): on an AckReq packet once the expected PSN has passed
    it, or every `ack_every` packets of progress. Messages complete, in order, when the
    expected PSN passes their LAST (or ONLY) packet.

    Groundwork for spray mode (issue 7); the in-order Responder serves every mode today.
    """

    def __init__(self, start_psn: int, ack_every: int = 16, window: int = 4096):
        if ack_every < 1 or not 1 <= window < MAX_OUTSTANDING:
            raise ValueError(f"need ack_every >= 1 and 1 <= window < {MAX_OUTSTANDING}")
        self.ack_every = ack_every
        self.window = window
        self.expected_psn = start_psn & PSN_MASK
        self.msn = 0
        self._held: dict[int, tuple[bool, bool]] = {}  # PSN ahead -> (ends a message, AckReq)
        self._unacked = 0
        self.packets = self.bytes = self.messages = 0
        self.duplicates = self.out_of_order = self.beyond_window = 0
        self.acks_sent = self.naks_sent = 0  # naks_sent stays 0: reordering is never NAKed

    def on_packet(self, opcode: int, psn: int, data_len: int,
                  ackreq: bool) -> tuple[int, int] | None:
        """Process one RC WRITE packet; the (ACK, PSN) reply to send, or None."""
        d = psn_diff(psn, self.expected_psn)
        if d < 0 or psn in self._held:  # already placed
            self.duplicates += 1
            return self._ack(self.expected_psn - 1) if ackreq else None
        if d >= self.window:
            self.beyond_window += 1
            return None
        self.packets += 1
        self.bytes += data_len
        ends = opcode in _ENDS
        if d > 0:  # ahead: hold it until the gap before it fills
            self.out_of_order += 1
            self._held[psn] = (ends, bool(ackreq))
            return None
        if self._advance(ends, bool(ackreq)):
            return self._ack(self.expected_psn - 1)
        return None

    def _advance(self, ends: bool, ackreq: bool) -> bool:
        """The expected packet arrived: move past it and every held packet right after it;
        True when an ACK is due."""
        want_ack = False
        while True:
            if ends:
                self.messages += 1
                self.msn = (self.msn + 1) & PSN_MASK
            want_ack |= ackreq
            self._unacked += 1
            self.expected_psn = (self.expected_psn + 1) & PSN_MASK
            nxt = self._held.pop(self.expected_psn, None)
            if nxt is None:
                return want_ack or self._unacked >= self.ack_every
            ends, ackreq = nxt

    def on_run(self, psn: int, count: int, data_bytes: int) -> tuple[int, int] | None:
        """`count` WRITE MIDDLE packets with consecutive PSNs from psn, none asking for an ACK
        (as the NIC's receive path merges them): on_packet for each; the last reply due."""
        per = data_bytes // count if count else 0
        reply = None
        for i in range(count):
            r = self.on_packet(_MIDDLE, (psn + i) & PSN_MASK, per, False)
            if r is not None:
                reply = r
        return reply

    @property
    def out_of_sequence(self) -> int:
        """Packets discarded for their PSN: here only those beyond the window (the in-order
        responder's name, so the NIC's stats and the summary count both alike)."""
        return self.beyond_window
