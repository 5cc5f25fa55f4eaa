"""The emulated RDMA NIC: RC queue pairs that send paced RDMA WRITEs and account what arrives.

Send path: a token bucket in Ethernet-frame bytes paces one process's traffic at the NIC line
rate; packets go round-robin over the queue pairs that have work, one kernel UDP socket per QP
(bound to the QP's fixed source port, so ECMP sees the QP's entropy). Receive path: one socket
on port 4791, demultiplexed by the BTH DestQP, with per-QP PSN and message accounting.
Everything runs in the caller's single-threaded loop: receive(), transmit(), wait().
"""

from __future__ import annotations

import errno
import select
import socket
from collections import deque
from dataclasses import dataclass

from fabric_emu import roce
from fabric_emu.agent.qps import QueuePair
from fabric_emu.cc.dcqcn import DcqcnParams, NotificationPoint, ReactionPoint

# Linux socket options the socket module does not name.
SO_NO_CHECK = 11
SO_RCVBUFFORCE = 33
IP_RECVERR = 11
IP_MTU_DISCOVER = 10
IP_PMTUDISC_DO = 2

BURST_PACKETS = 2
MAX_BATCH = 64  # packets per transmit() call, so receiving is never starved
RETRY_DELAY_S = 100e-6  # after the kernel refused a packet (EAGAIN/ENOBUFS) ...
# ... doubling while it keeps refusing, up to this: a PFC-paused host queue may stay shut for
# up to a second, and retrying every 100 us would burn the CPU other agents need.
MAX_RETRY_DELAY_S = 2e-3
RX_SERIES_INTERVAL_S = 0.05  # emulated seconds between points of a receive QP's rx_series
RECV_BUFFER_BYTES = 8 << 20
MAX_TRACKED_GAP = 1 << 16  # larger PSN jumps count as missing for good, not tracked one by one
_HALF_PSN_SPACE = 1 << 23
# The kernel refused the packet for now (full buffer or queue, or an ICMP error reported by
# IP_RECVERR); the same packet is sent again later.
_RETRY_ERRNOS = frozenset({errno.EAGAIN, errno.ENOBUFS, errno.ECONNREFUSED,
                           errno.EHOSTUNREACH, errno.ENETUNREACH})


@dataclass(frozen=True)
class DcqcnSetup:
    """What the NIC needs to run DCQCN (from the agent config)."""

    params: DcqcnParams
    dilation: float
    line_rate_bps: float  # modelled


class TokenBucket:
    """Pacing in frame bytes at a fixed rate, with a small burst allowance."""

    def __init__(self, rate_bps: float, burst_bytes: int, now: float):
        self.rate = rate_bps / 8
        self.burst = burst_bytes
        self.tokens = float(burst_bytes)
        self.stamp = now

    def ready_at(self, nbytes: int) -> float:
        """The earliest time nbytes may be sent."""
        if self.tokens >= nbytes:
            return self.stamp
        return self.stamp + (nbytes - self.tokens) / self.rate

    def consume(self, nbytes: int, now: float) -> None:
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate) - nbytes
        self.stamp = now

    def set_rate(self, rate_bps: float, now: float) -> None:
        """Change the rate from now on (tokens earned so far are kept)."""
        if now > self.stamp:
            self.consume(0, now)
        self.rate = rate_bps / 8


class SendQp:
    """Requester side of a QP: a FIFO of WRITE messages cut into MTU-sized packets."""

    def __init__(self, qp: QueuePair, dst_ip: str, mtu: int, sock: socket.socket):
        self.qp = qp
        self.dst_ip = dst_ip
        self.addr = (dst_ip, roce.ROCE_UDP_PORT)
        self.sock = sock
        self.mtu = mtu
        self.psn = qp.start_psn
        self.messages: deque[int] = deque()  # lengths of posted, unfinished messages
        self.offset = 0  # bytes of the head message already sent
        self.messages_done = 0
        self.bytes = self.frame_bytes = self.packets = 0
        self.first_tx: float | None = None
        self.last_tx: float | None = None
        self._prefix_crc: dict[int, int] = {}
        self.rp: ReactionPoint | None = None  # DCQCN's reaction point, when on
        self.limiter: TokenBucket | None = None  # paces the QP while DCQCN holds it below line rate
        self.cnp_received = 0
        self.min_rate_bps: float | None = None  # lowest DCQCN rate, modelled

    def next_packet(self) -> tuple[int, int]:
        """(opcode, data bytes) of the next packet of the head message."""
        size, offset, mtu = self.messages[0], self.offset, self.mtu
        if offset == 0 and size <= mtu:
            return roce.RC_RDMA_WRITE_ONLY, size
        if offset == 0:
            return roce.RC_RDMA_WRITE_FIRST, mtu
        left = size - offset
        return (roce.RC_RDMA_WRITE_MIDDLE, mtu) if left > mtu else (roce.RC_RDMA_WRITE_LAST, left)

    def prefix_crc(self, src_ip: str, udp_payload: int) -> int:
        crc = self._prefix_crc.get(udp_payload)
        if crc is None:
            crc = self._prefix_crc[udp_payload] = roce.icrc_prefix(
                src_ip, self.dst_ip, self.qp.udp_sport, udp_payload)
        return crc

    def advance(self, data_len: int, frame: int, now: float) -> None:
        """Account one sent packet; pops the message when it was its last."""
        self.psn = (self.psn + 1) & roce.PSN_MASK
        self.bytes += data_len
        self.frame_bytes += frame
        self.packets += 1
        if self.first_tx is None:
            self.first_tx = now
        self.last_tx = now
        self.offset += data_len
        if self.offset >= self.messages[0]:
            self.messages.popleft()
            self.offset = 0
            self.messages_done += 1

    def stats(self) -> dict:
        return {"qpn": self.qp.src_qpn, "remote_qpn": self.qp.dst_qpn, "dst": self.qp.dst,
                "dst_ip": self.dst_ip, "udp_src": self.qp.udp_sport, "bytes": self.bytes,
                "frame_bytes": self.frame_bytes, "packets": self.packets,
                "messages": self.messages_done, "first_tx": self.first_tx, "last_tx": self.last_tx,
                "cnp_received": self.cnp_received, "rate_cuts": self.rp.cuts if self.rp else 0,
                "min_rate_bps": self.min_rate_bps}


class RecvQp:
    """Responder side of a QP: PSN checks and WRITE message completion.

    Only packets at or ahead of the expected PSN drive the message state, so a late packet
    never reopens a finished message. A FIRST/ONLY while a message is open, or a MIDDLE/LAST
    without one, means packets were lost: the message still completes, marked damaged, so the
    schedule does not hang on a lost LAST. A skipped PSN that arrives later counts as
    out-of-order, not missing: `missing` is the skipped PSNs that have not arrived (yet).
    rx_series holds [time, bytes received before it] at most every RX_SERIES_INTERVAL_S.
    """

    def __init__(self, qp: QueuePair):
        self.qp = qp
        self.expected_psn = qp.start_psn
        self.gaps: set[int] = set()  # PSNs skipped and not yet seen
        self.untracked_missing = 0  # PSNs of gaps too large to track one by one
        self.bytes = self.packets = 0
        self.out_of_order = self.duplicates = self.ecn_ce = 0
        self.messages = self.damaged_messages = 0
        self.first_rx: float | None = None
        self.last_rx: float | None = None
        self.rx_series: list[list[float]] = []
        self._next_point = 0.0
        self.np: NotificationPoint | None = None  # DCQCN's notification point, when on
        self.cnp: bytes = b""  # the CNP this QP sends back (constant: built once)
        self.cnp_addr: tuple[str, int] = ("", 0)
        self.cnp_sent = 0
        self._open = False
        self._damaged = False

    @property
    def missing(self) -> int:
        """Skipped PSNs that never arrived (so far)."""
        return len(self.gaps) + self.untracked_missing

    def on_packet(self, opcode: int, psn: int, data_len: int, ce: bool, now: float) -> None:
        ahead = (psn - self.expected_psn) & roce.PSN_MASK
        if ahead >= _HALF_PSN_SPACE:  # behind the expected PSN
            if psn not in self.gaps:
                self.duplicates += 1
                return
            self.gaps.discard(psn)
            self.out_of_order += 1
            self._count(data_len, ce, now)
            return
        if ahead:
            if ahead <= MAX_TRACKED_GAP:
                self.gaps.update((self.expected_psn + i) & roce.PSN_MASK for i in range(ahead))
            else:
                self.untracked_missing += ahead
            self._damaged = True
        self.expected_psn = (psn + 1) & roce.PSN_MASK
        self._count(data_len, ce, now)
        self._on_opcode(opcode)

    def _count(self, data_len: int, ce: bool, now: float) -> None:
        if now >= self._next_point:
            self.rx_series.append([now, self.bytes])
            self._next_point = now + RX_SERIES_INTERVAL_S
        self.bytes += data_len
        self.packets += 1
        self.ecn_ce += ce
        if self.first_rx is None:
            self.first_rx = now
        self.last_rx = now

    def _on_opcode(self, opcode: int) -> None:
        starts = opcode in (roce.RC_RDMA_WRITE_FIRST, roce.RC_RDMA_WRITE_ONLY)
        ends = opcode in (roce.RC_RDMA_WRITE_LAST, roce.RC_RDMA_WRITE_ONLY)
        if starts and self._open:
            self._complete(damaged=True)
        if not starts and not self._open:
            self._damaged = True
        self._open = True
        if ends:
            self._complete(damaged=self._damaged)

    def _complete(self, damaged: bool) -> None:
        self.messages += 1
        self.damaged_messages += damaged
        self._open = self._damaged = False

    def stats(self) -> dict:
        return {"qpn": self.qp.dst_qpn, "remote_qpn": self.qp.src_qpn, "src": self.qp.src,
                "udp_src": self.qp.udp_sport, "bytes": self.bytes, "packets": self.packets,
                "messages": self.messages, "damaged_messages": self.damaged_messages,
                "out_of_order": self.out_of_order, "missing": self.missing,
                "duplicates": self.duplicates, "ecn_ce": self.ecn_ce, "cnp_sent": self.cnp_sent,
                "first_rx": self.first_rx, "last_rx": self.last_rx, "rx_series": self._series()}

    def _series(self) -> list[list[float]]:
        """rx_series with a final point at the last packet."""
        if self.last_rx is None or self.rx_series[-1] == [self.last_rx, self.bytes]:
            return list(self.rx_series)
        return [*self.rx_series, [self.last_rx, self.bytes]]


class Nic:
    """Sockets, pacing and the queue pairs of one host."""

    def __init__(self, ip: str, rate_bps: float, roce_mtu: int, send_qps: list[QueuePair],
                 recv_qps: list[QueuePair], ip_of: dict[str, str], now: float,
                 dcqcn: "DcqcnSetup | None" = None):
        self.ip = ip
        self.rate_bps = rate_bps
        self.mtu = roce_mtu
        self._writer = roce.PacketWriter(roce_mtu)
        max_frame = roce.frame_len(roce.udp_payload_len(roce.RC_RDMA_WRITE_FIRST, roce_mtu))
        self.pacer = TokenBucket(rate_bps, BURST_PACKETS * max_frame, now)
        self._rsock = _receive_socket(ip)
        self.send_qps = [SendQp(qp, ip_of[qp.dst], roce_mtu, _send_socket(ip, qp.udp_sport))
                         for qp in send_qps]
        self.recv_qps = [RecvQp(qp) for qp in recv_qps]
        self._by_qpn = {rq.qp.dst_qpn: rq for rq in self.recv_qps}
        self._active: deque[SendQp] = deque()  # QPs with posted work, in round-robin order
        self._rbuf = bytearray(65536)
        self._rbufs = [self._rbuf]
        self._ancsize = socket.CMSG_SPACE(1)
        # pacing and receive-side counters
        self.retry_delay_s = RETRY_DELAY_S  # the wait after the next refused packet
        self.eagain_retries = 0
        self.send_errors = 0
        self.max_lateness_s = 0.0
        self.busy_s = 0.0
        self._eligible_since = now
        self._busy_start = now
        self._busy_end = now
        self.rx_unknown_qp = self.rx_malformed = self.rx_other_opcode = 0
        self.max_frame = max_frame
        self.dcqcn = dcqcn
        self._limited: set[SendQp] = set()  # QPs DCQCN holds below line rate
        self._send_by_qpn = {sq.qp.src_qpn: sq for sq in self.send_qps}
        self._cnp_sock: socket.socket | None = None
        self.cnp_send_errors = 0
        if dcqcn is not None:
            self._cnp_sock = _cnp_socket(ip)
            sport = self._cnp_sock.getsockname()[1]
            for sq in self.send_qps:
                sq.rp = ReactionPoint(dcqcn.params, dcqcn.line_rate_bps, dcqcn.dilation)
            port_np = NotificationPoint(dcqcn.params, dcqcn.dilation)
            for rq in self.recv_qps:
                per_port = dcqcn.params.cnp_pacing_per_port
                rq.np = port_np if per_port else NotificationPoint(dcqcn.params, dcqcn.dilation)
                src_ip = ip_of[rq.qp.src]
                rq.cnp = roce.build_cnp(ip, src_ip, sport, rq.qp.src_qpn)
                rq.cnp_addr = (src_ip, roce.ROCE_UDP_PORT)

    def close(self) -> None:
        self._rsock.close()
        if self._cnp_sock is not None:
            self._cnp_sock.close()
        for sq in self.send_qps:
            sq.sock.close()

    @property
    def idle(self) -> bool:
        """Nothing posted is left to send."""
        return not self._active

    def post_write(self, qp_index: int, nbytes: int, now: float) -> None:
        """Queue one RDMA WRITE message of nbytes on a send QP."""
        sq = self.send_qps[qp_index]
        if not self._active:
            self._eligible_since = now
            self._busy_start = max(now, self._busy_end)
        if not sq.messages:
            self._active.append(sq)
        sq.messages.append(nbytes)

    def transmit(self, now: float) -> float | None:
        """Send what the token bucket allows; the time to call again, or None when idle."""
        if self._limited:
            self._dcqcn_timers(now)
        for _ in range(MAX_BATCH):
            if not self._active:
                return None
            if self._limited:
                held = self._next_unlimited(now)
                if held is not None:  # every QP with work waits for its DCQCN rate
                    return held
            sq = self._active[0]
            opcode, data_len = sq.next_packet()
            udp_payload = roce.udp_payload_len(opcode, data_len)
            frame = udp_payload + roce.FRAME_OVERHEAD
            ready = self.pacer.ready_at(frame)
            if now < ready:
                return ready
            wait = self._send(sq, opcode, data_len, udp_payload)
            if wait:
                return now + wait
            self.pacer.consume(frame, now)
            if sq.limiter is not None:
                sq.limiter.consume(frame, now)
                sq.rp.on_sent(frame)
                self._rate_changed(sq, now)
            self.max_lateness_s = max(self.max_lateness_s, now - max(ready, self._eligible_since))
            sq.advance(data_len, frame, now)
            self._active.rotate(-1)
            if not sq.messages:
                self._active.pop()
                if not self._active:
                    self._busy_end = now + frame * 8 / self.rate_bps
                    self.busy_s += self._busy_end - self._busy_start
        return now

    def _next_unlimited(self, now: float) -> float | None:
        """Rotate a QP whose DCQCN rate allows a packet now to the head; else the time one will."""
        earliest = None
        for _ in range(len(self._active)):
            sq = self._active[0]
            if sq.limiter is None:
                return None
            ready = sq.limiter.ready_at(self.max_frame)
            if now >= ready:
                return None
            earliest = ready if earliest is None else min(earliest, ready)
            self._active.rotate(-1)
        return earliest

    def _dcqcn_timers(self, now: float) -> None:
        for sq in list(self._limited):
            deadline = sq.rp.next_deadline()
            if deadline is not None and now >= deadline:
                sq.rp.on_timer(now)
                self._rate_changed(sq, now)

    def _rate_changed(self, sq: SendQp, now: float) -> None:
        """Apply the QP's DCQCN rate (modelled) to its limiter (emulated), or release it."""
        rp = sq.rp
        if not rp.active:
            sq.limiter = None
            self._limited.discard(sq)
            return
        rate = rp.rate / self.dcqcn.dilation
        if sq.limiter is None:
            sq.limiter = TokenBucket(rate, BURST_PACKETS * self.max_frame, now)
            self._limited.add(sq)
        else:
            sq.limiter.set_rate(rate, now)
        if sq.min_rate_bps is None or rp.rate < sq.min_rate_bps:
            sq.min_rate_bps = rp.rate

    def _send_cnp(self, rq: RecvQp) -> None:
        try:
            self._cnp_sock.sendto(rq.cnp, rq.cnp_addr)
            rq.cnp_sent += 1
        except OSError as e:
            if e.errno not in _RETRY_ERRNOS:
                raise
            self.cnp_send_errors += 1  # a CNP the NIC could not queue is lost, as on hardware

    def _send(self, sq: SendQp, opcode: int, data_len: int, udp_payload: int) -> float:
        """Hand one packet to the kernel: 0.0 when it took it, else the seconds to wait."""
        last = opcode in (roce.RC_RDMA_WRITE_LAST, roce.RC_RDMA_WRITE_ONLY)
        reth = (0, sq.qp.dst_qpn, sq.messages[0]) if roce.has_reth(opcode) else None
        packet = self._writer.write(sq.prefix_crc(self.ip, udp_payload), opcode, sq.qp.dst_qpn,
                                    sq.psn, data_len, ackreq=last, reth_fields=reth)
        try:
            sq.sock.sendto(packet, sq.addr)
        except OSError as e:
            if e.errno == errno.EMSGSIZE:
                raise RuntimeError(f"a {udp_payload + 28} B IP packet exceeds the path MTU to "
                                   f"{sq.dst_ip}; lower roce_mtu or raise the link MTU") from None
            if e.errno not in _RETRY_ERRNOS:
                raise
            if e.errno not in (errno.EAGAIN, errno.ENOBUFS):
                self.send_errors += 1
                return RETRY_DELAY_S
            # The host's queue is full (or paused): back off exponentially while it stays so.
            self.eagain_retries += 1
            wait = self.retry_delay_s
            self.retry_delay_s = min(2 * wait, MAX_RETRY_DELAY_S)
            return wait
        self.retry_delay_s = RETRY_DELAY_S
        return 0.0

    def receive(self, now: float) -> None:
        """Drain the receive socket without blocking."""
        rbuf, by_qpn = self._rbuf, self._by_qpn
        while True:
            try:
                n, anc, _flags, _addr = self._rsock.recvmsg_into(self._rbufs, self._ancsize)
            except BlockingIOError:
                return
            if n < roce.BTH_LEN + roce.ICRC_LEN:
                self.rx_malformed += 1
                continue
            opcode, dest_qp, psn, _becn, _ackreq = roce.parse_bth(rbuf)
            if opcode == roce.CNP_OPCODE:
                self._on_cnp(dest_qp, now)
                continue
            rq = by_qpn.get(dest_qp)
            if rq is None:
                self.rx_unknown_qp += 1
                continue
            if not roce.RC_RDMA_WRITE_FIRST <= opcode <= roce.RC_RDMA_WRITE_ONLY:
                self.rx_other_opcode += 1
                continue
            header = roce.BTH_LEN + (roce.RETH_LEN if roce.has_reth(opcode) else 0)
            data_len = n - header - roce.ICRC_LEN - (rbuf[1] >> 4 & 3)
            ce = bool(anc) and (anc[0][2][0] & 3) == roce.ECN_CE
            rq.on_packet(opcode, psn, data_len, ce, now)
            if ce and rq.np is not None and rq.np.on_ce(now):
                self._send_cnp(rq)

    def _on_cnp(self, dest_qp: int, now: float) -> None:
        sq = self._send_by_qpn.get(dest_qp)
        if sq is None:
            self.rx_unknown_qp += 1
            return
        sq.cnp_received += 1
        if sq.rp is not None:
            sq.rp.on_cnp(now)
            self._rate_changed(sq, now)

    def wait(self, timeout: float) -> bool:
        """Sleep until a packet arrives or timeout seconds pass; False if surely nothing came."""
        if timeout <= 0:
            return True
        readable, _, _ = select.select([self._rsock], [], [], timeout)
        return bool(readable)

    def pacing_stats(self) -> dict:
        sent = sum(sq.frame_bytes for sq in self.send_qps)
        return {"rate_bps": self.rate_bps,
                "achieved_bps": sent * 8 / self.busy_s if self.busy_s > 0 else None,
                "busy_s": self.busy_s, "frame_bytes": sent,
                "eagain_retries": self.eagain_retries, "send_errors": self.send_errors,
                "max_lateness_s": self.max_lateness_s}

    def receive_stats(self) -> dict:
        return {"unknown_qp": self.rx_unknown_qp, "malformed": self.rx_malformed,
                "other_opcode": self.rx_other_opcode, "cnp_send_errors": self.cnp_send_errors}


def _receive_socket(ip: str) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:  # a deep buffer absorbs bursts while the loop is sending; FORCE needs CAP_NET_ADMIN
        s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RECV_BUFFER_BYTES)
    except PermissionError:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECV_BUFFER_BYTES)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
    s.bind((ip, roce.ROCE_UDP_PORT))
    s.setblocking(False)
    return s


def _cnp_socket(ip: str) -> socket.socket:
    """Where CNPs leave: DSCP 48 (the strict-priority class), not ECN-capable, UDP checksum 0."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 1)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, roce.TOS_CNP)
    s.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
    s.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
    s.bind((ip, 0))
    s.setblocking(False)
    return s


def _send_socket(ip: str, sport: int) -> socket.socket:
    """A QP's socket: fixed source port, UDP checksum 0, RoCE DSCP + ECT(0), DF with IP id 0."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 1)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, roce.TOS_ROCE)
    s.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
    # Report local queue drops as ENOBUFS instead of dropping the packet silently.
    s.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
    s.bind((ip, sport))
    s.setblocking(False)
    return s
