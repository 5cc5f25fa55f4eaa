"""One host's emulated RDMA NIC: RC queue pairs, their rate limiters, transport and DCQCN.

What the NIC does, and where:
* queue pairs: SendQp (requester) and RecvQp (responder), one per end of each connection;
* transport: the pure RC state machines of fabric_emu.nic.transport (PSNs, coalesced ACKs,
  NAK, go-back-N, retransmission timeout); a message completes when it is acknowledged;
* congestion control: DCQCN's reaction point per send QP and notification point per receiver
  (fabric_emu.cc.dcqcn), fed by CE marks and CNPs;
* rate limiting: the KERNEL paces. Each send QP owns a UDP socket whose packets carry the QP's
  mark, so the host port's qp_classify program puts them in the QP's own HTB class, whose rate
  is the QP's DCQCN rate (fabric_emu.ports.qp_limiter); above it sit the RoCE class's PFC gate
  and the NIC's line-rate class. Python only decides rates. The socket's send buffer bounds
  what waits in the kernel, so a full socket (EAGAIN) is the NIC's "send queue full".

The engine (fabric_emu.nic.engine) calls fill(), receive() and on_timers(); nothing here
blocks or sleeps. The sockets are opened inside the host's network namespace.
"""

from __future__ import annotations

import errno
import fcntl
import socket
import struct
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from fabric_emu.wire import roce
from fabric_emu.lb import spray
from fabric_emu.nic import fastpath
from fabric_emu.nic.config import TransportConfig
from fabric_emu.nic.qps import QueuePair
from fabric_emu.nic.transport import ReorderingResponder, Requester, Responder
from fabric_emu.cc.dcqcn import DcqcnParams, NotificationPoint, ReactionPoint
from fabric_emu.ports.qp_limiter import QpLimiter, qp_mark

# Linux socket options the socket module does not name.
SO_NO_CHECK = 11
SO_RCVBUFFORCE = 33
SO_SNDBUFFORCE = 32
SO_MARK = 36
SIOCOUTQ = 0x5411
IP_MTU_DISCOVER = 10
IP_PMTUDISC_DO = 2

RECV_BUFFER_BYTES = 8 << 20
CONTROL_BUFFER_BYTES = 1 << 20
# A socket buffer is charged the skb's truesize, about a frame plus slab rounding: budget twice
# the frame so the intended number of packets fits.
TRUESIZE_FACTOR = 2
MIN_QUEUED_PACKETS = 2  # per QP socket, however slow the QP's rate
RX_SERIES_INTERVAL_S = 0.05  # emulated seconds between points of a receive QP's rx_series
RATE_SERIES_MAX = 20_000  # points per QP; beyond it the series keeps only changes >= 1%
_FULL = (errno.EAGAIN, errno.ENOBUFS)
TOS_ACK = roce.DSCP_ROCE << 2  # ACKs and NAKs ride the RoCE class, not ECN-capable
_FIRST_WRITE, _LAST_WRITE = roce.RC_RDMA_WRITE_FIRST, roce.RC_RDMA_WRITE_ONLY


@dataclass(frozen=True)
class DcqcnSetup:
    """What the NIC needs to run DCQCN (from the agent config)."""

    params: DcqcnParams
    dilation: float
    line_rate_bps: float  # modelled


class SendQp:
    """Requester side of a QP: its socket, its packets, its transport and DCQCN state."""

    def __init__(self, k: int, qp: QueuePair, src_ip: str, dst_ip: str, mtu: int,
                 socks: list[socket.socket], transport: TransportConfig):
        self.k = k  # the QP's index in the host: its mark and rate class
        self.qp = qp
        self.dst_ip = dst_ip
        self.socks = socks  # one, or when spraying one per UDP source port, all in one rate class
        self.req = Requester(qp.start_psn, mtu, transport.rto_s, transport.retry_limit)
        packets = [roce.QpPackets(src_ip, dst_ip, s.getsockname()[1], qp.dst_qpn, mtu, rkey=qp.dst_qpn)
                   for s in socks]
        self.sender = fastpath.QpSender(packets, socks, dst_ip)
        self.rp: ReactionPoint | None = None
        self.rate_bps: float | None = None  # the kernel class's rate now (modelled), if limited
        self.min_rate_bps: float | None = None
        self.rates: list[list[float]] = []  # [emulated time, modelled rate] at each change
        self.cnp_received = 0
        self.frame_bytes = 0
        self.first_tx: float | None = None
        self.last_tx: float | None = None

    @property
    def messages_done(self) -> int:
        """Messages acknowledged: a WRITE completes on its ACK, as on a real NIC."""
        return self.req.messages_done

    @property
    def messages_sent(self) -> int:
        """Messages whose last packet has been handed to the kernel at least once."""
        return self.req.messages_sent

    def due(self) -> float | None:
        """The next time on_timers has work: the retransmission timer or DCQCN's timers."""
        a = self.req.deadline
        b = self.rp.next_deadline() if self.rp is not None else None
        if a is None:
            return b
        return a if b is None else min(a, b)

    def stats(self) -> dict:
        r = self.req
        return {"qpn": self.qp.src_qpn, "remote_qpn": self.qp.dst_qpn, "dst": self.qp.dst,
                "dst_ip": self.dst_ip, "udp_src": self.qp.udp_sport,
                "bytes": r.bytes_acked, "bytes_sent": r.bytes_sent, "frame_bytes": self.frame_bytes,
                "packets": r.packets_sent, "retransmitted": r.retransmitted, "naks": r.naks,
                "timeouts": r.timeouts, "messages": r.messages_done, "error": r.error,
                "first_tx": self.first_tx, "last_tx": self.last_tx,
                "cnp_received": self.cnp_received, "rate_cuts": self.rp.cuts if self.rp else 0,
                "min_rate_bps": self.min_rate_bps, "rates": self.rates}


class RecvQp:
    """Responder side of a QP: in-order acceptance, ACK/NAK replies, CE marks and CNPs."""

    def __init__(self, qp: QueuePair, ack_every: int, reordering: bool = False):
        self.qp = qp
        # Spraying: packets of one QP take different paths, so place them by PSN (never NAK).
        self.resp: Responder | ReorderingResponder = (
            ReorderingResponder(qp.start_psn, ack_every) if reordering
            else Responder(qp.start_psn, ack_every))
        self.acks: roce.AckWriter | None = None  # set by the NIC once its control port is known
        self.ack_addr = ("", 0)
        self.np: NotificationPoint | None = None
        self.cnp = b""
        self.ecn_ce = self.cnp_sent = 0
        self.first_rx: float | None = None
        self.last_rx: float | None = None
        self.rx_series: list[list[float]] = []
        self.next_point = 0.0

    @property
    def messages(self) -> int:
        return self.resp.messages

    def add_point(self, now: float) -> None:
        """A point of rx_series (bytes received before now); the receive loop calls it once
        now >= next_point, and sets last_rx itself (both per packet, so kept cheap)."""
        self.rx_series.append([now, self.resp.bytes])
        self.next_point = now + RX_SERIES_INTERVAL_S
        if self.first_rx is None:
            self.first_rx = now

    def stats(self) -> dict:
        r = self.resp
        return {"qpn": self.qp.dst_qpn, "remote_qpn": self.qp.src_qpn, "src": self.qp.src,
                "udp_src": self.qp.udp_sport, "bytes": r.bytes, "packets": r.packets,
                "messages": r.messages, "duplicates": r.duplicates,
                "out_of_sequence": r.out_of_sequence, "out_of_order": getattr(r, "out_of_order", 0),
                "reordered": getattr(r, "reordered", 0), "reordered_last_at": getattr(r, "last_reordered_at", -1),
                "acks_sent": r.acks_sent,
                "naks_sent": r.naks_sent, "ecn_ce": self.ecn_ce, "cnp_sent": self.cnp_sent,
                "first_rx": self.first_rx, "last_rx": self.last_rx, "rx_series": self._series()}

    def _series(self) -> list[list[float]]:
        """rx_series with a final point at the last packet."""
        if self.last_rx is None or self.rx_series[-1] == [self.last_rx, self.resp.bytes]:
            return list(self.rx_series)
        return [*self.rx_series, [self.last_rx, self.resp.bytes]]


class HostLog:
    """One host's NIC log: the rare events of its QPs (timeouts, NAKs, first CNP, failure), one
    line each with the emulated time. The file is created at the first line, so an uneventful
    host leaves none."""

    def __init__(self, path: Path | None):
        self.path = path
        self._file: TextIO | None = None

    def __call__(self, now: float, message: str) -> None:
        if self.path is None:
            return
        if self._file is None:
            self._file = open(self.path, "a")
        self._file.write(f"{now:.6f} {message}\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


@dataclass(frozen=True)
class NicSetup:
    host: str
    ip: str
    rate_bps: float  # emulated line rate, Ethernet frame bits
    roce_mtu: int
    link_mtu: int  # the link's IP MTU
    transport: TransportConfig  # emulated seconds
    tick_s: float  # the engine's longest sleep while sends wait on full sockets
    dcqcn: DcqcnSetup | None = None
    spray_entropies: int = 0  # UDP source ports per send QP when spraying (0: no spraying)


@dataclass
class HostSockets:
    """The sockets and netlink handles of one host, opened inside its namespace."""

    receive: socket.socket
    control: socket.socket  # ACKs and NAKs: RoCE DSCP, not ECN-capable
    cnp: socket.socket
    qps: list[list[socket.socket]]  # per send QP: one socket, or one per entropy when spraying
    limiter: QpLimiter
    netlink: socket.socket


def max_frame(roce_mtu: int) -> int:
    return roce.frame_len(roce.udp_payload_len(roce.RC_RDMA_WRITE_FIRST, roce_mtu))


def socket_budget(setup: NicSetup, rate_bps: float) -> tuple[int, float]:
    """(send buffer bytes of each of its sockets, seconds its packets may wait in the kernel) for
    a QP at rate_bps (emulated): two engine ticks of packets at that rate, at least
    MIN_QUEUED_PACKETS per socket (a spraying QP shares the budget among its sockets).

    The retransmission timer starts when a packet is handed to the kernel, but a NIC starts it
    when the packet leaves: the wait allowed here is added to the timeout, and shrinking the
    buffer with the rate keeps that wait short. (A timer that still expires while the QP's
    packets are queued, behind a pause, is held: HostNic.on_timers.)"""
    frame = max_frame(setup.roce_mtu)
    sockets = max(1, setup.spray_entropies)
    packets = int(2 * setup.tick_s * rate_bps / 8 / frame) + 1
    per_socket = max(MIN_QUEUED_PACKETS, -(-packets // sockets))
    return per_socket * frame * TRUESIZE_FACTOR, per_socket * sockets * frame * 8 / rate_bps


def open_sockets(setup: NicSetup, send_ports: list[int], ifname: str) -> HostSockets:
    """Open a host's sockets; call inside the host's namespace (a thread that did setns)."""
    from fabric_emu.kernel.rtnl import netlink_socket

    sndbuf = socket_budget(setup, setup.rate_bps)[0]
    if setup.spray_entropies:
        qps = [[_send_socket(setup.ip, p, qp_mark(k), sndbuf, shared=True)
                for p in spray.entropy_ports(port, setup.spray_entropies)]
               for k, port in enumerate(send_ports)]
    else:
        qps = [[_send_socket(setup.ip, port, qp_mark(k), sndbuf)] for k, port in enumerate(send_ports)]
    nl = netlink_socket(None)
    limiter = QpLimiter(nl, socket.if_nametoindex(ifname), setup.link_mtu)
    return HostSockets(_receive_socket(setup.ip), _control_socket(setup.ip, TOS_ACK),
                       _control_socket(setup.ip, roce.TOS_CNP), qps, limiter, nl)


class HostNic:
    """The NIC of one host: queue pairs, sockets, rates, counters."""

    def __init__(self, setup: NicSetup, socks: HostSockets, send_qps: list[QueuePair],
                 recv_qps: list[QueuePair], ip_of: dict[str, str], now: float,
                 log: HostLog | None = None):
        self.setup = setup
        self.log = log or HostLog(None)
        self.ip = setup.ip
        self.rate_bps = setup.rate_bps
        self.socks = socks
        t = setup.transport
        self.send_qps = [SendQp(k, qp, setup.ip, ip_of[qp.dst], setup.roce_mtu, socks.qps[k], t)
                         for k, qp in enumerate(send_qps)]
        self.recv_qps = [RecvQp(qp, t.ack_every, reordering=setup.spray_entropies > 0)
                         for qp in recv_qps]
        self._recv_by_qpn = {rq.qp.dst_qpn: rq for rq in self.recv_qps}
        self._send_by_qpn = {sq.qp.src_qpn: sq for sq in self.send_qps}
        self._active: deque[SendQp] = deque()  # QPs with packets waiting, in round-robin order
        self._receiver = fastpath.Receiver(socks.receive)
        self.dcqcn = setup.dcqcn
        ack_port = socks.control.getsockname()[1]
        cnp_port = socks.cnp.getsockname()[1]
        port_np = None
        for rq in self.recv_qps:
            src_ip = ip_of[rq.qp.src]
            rq.acks = roce.AckWriter(setup.ip, src_ip, ack_port, rq.qp.src_qpn)
            rq.ack_addr = (src_ip, roce.ROCE_UDP_PORT)
            if self.dcqcn is not None:
                p = self.dcqcn.params
                if p.cnp_pacing_per_port:
                    port_np = port_np or NotificationPoint(p, self.dcqcn.dilation)
                rq.np = port_np or NotificationPoint(p, self.dcqcn.dilation)
                rq.cnp = roce.build_cnp(setup.ip, src_ip, cnp_port, rq.qp.src_qpn)
        line = setup.rate_bps
        for sq in self.send_qps:
            socks.limiter.add(sq.k, line)
            sq.req.rto_s = t.rto_s + socket_budget(setup, line)[1]
            if self.dcqcn is not None:
                sq.rp = ReactionPoint(self.dcqcn.params, self.dcqcn.line_rate_bps, self.dcqcn.dilation)
        # counters
        self.full_socket_waits = 0  # fills that stopped on a full socket: the kernel paces
        self.busy_s = 0.0
        self._busy_start = self._busy_end = now
        self.rx_unknown_qp = self.rx_malformed = self.rx_other_opcode = 0
        self.control_send_errors = 0
        self.timer_holds = 0  # retransmission timeouts deferred while packets were still queued
        self.error: str | None = None

    def close(self) -> None:
        s = self.socks
        for sock in (s.receive, s.control, s.cnp, *(q for qp in s.qps for q in qp), s.netlink):
            sock.close()
        self.log.close()

    @property
    def idle(self) -> bool:
        """Nothing posted is left to send."""
        return not self._active

    def post_write(self, qp_index: int, nbytes: int, now: float) -> None:
        """Queue one RDMA WRITE message of nbytes on a send QP."""
        sq = self.send_qps[qp_index]
        sq.req.post(nbytes)
        self.resume(sq, now)

    # ----------------------------------------------------------------- send
    def fill(self, now: float) -> bool:
        """Hand the kernel every packet its QP sockets take; True while work waits on them."""
        active = self._active
        for _ in range(len(active)):
            sq = active[0]
            req, send_run = sq.req, sq.sender.send_run
            sent_frames = 0
            while True:
                p = req.peek()  # the next run of packets
                if p is None:
                    break
                count = p.count
                try:
                    n, udp_len = send_run(p.opcode, p.psn, p.data_len, count, p.ackreq, p.message_len)
                except OSError as e:
                    if e.errno == errno.EMSGSIZE:
                        ip_len = roce.udp_payload_len(p.opcode, p.data_len) + 28
                        raise RuntimeError(f"a {ip_len} B IP packet exceeds the path MTU to "
                                           f"{sq.dst_ip}; lower roce_mtu or raise the link MTU") from None
                    raise
                if n:
                    req.sent(now, n)
                    sent_frames += n * (udp_len + roce.FRAME_OVERHEAD)
                if n < count:  # the socket is full: the kernel paces, we come back next tick
                    self.full_socket_waits += 1
                    break
            if sent_frames:
                sq.frame_bytes += sent_frames
                if sq.first_tx is None:
                    sq.first_tx = now
                sq.last_tx = now
                if sq.rp is not None and sq.rp.active:
                    sq.rp.on_sent(sent_frames)
                    self._apply_rate(sq, now)
            active.rotate(-1)
            if not req.has_work:
                active.remove(sq)
        if not active:
            self._busy_end = max(now, self._busy_end)
            self.busy_s += self._busy_end - self._busy_start
            self._busy_start = self._busy_end
        return bool(active)

    def resume(self, sq: SendQp, now: float) -> None:
        """A QP got work (a posted message, a go-back-N rewind): put it in the send rotation."""
        if sq.req.has_work and sq not in self._active:
            if not self._active:
                self._busy_start = max(now, self._busy_end)
            self._active.append(sq)

    # ----------------------------------------------------------------- timers
    def on_timers(self, sq: SendQp, now: float) -> None:
        """Run the QP's due timers: retransmission timeout and DCQCN's rate/alpha timers."""
        deadline = sq.req.deadline
        if deadline is not None and now >= deadline and any(map(_unsent_bytes, sq.socks)):
            sq.req.hold(now)  # still queued in the kernel (paused, or a slow rate class)
            self.timer_holds += 1
        elif deadline is not None and now >= deadline:
            timeouts = sq.req.timeouts
            sq.req.on_timer(now)
            if sq.req.timeouts > timeouts:
                self.log(now, f"{_qp_name(sq)}: retransmission timeout {sq.req.timeouts}, "
                              f"sending again from PSN {sq.req.una:#08x}")
            if sq.req.error and self.error is None:
                self.error = f"{_qp_name(sq)}: {sq.req.error}"
                self.log(now, self.error)
            self.resume(sq, now)
        rp = sq.rp
        if rp is not None:
            d = rp.next_deadline()
            if d is not None and now >= d:
                rp.on_timer(now)
                self._apply_rate(sq, now)

    def _apply_rate(self, sq: SendQp, now: float) -> None:
        """Give the kernel the QP's DCQCN rate (modelled -> emulated) when it changed."""
        rp = sq.rp
        rate = rp.rate if rp.active else None
        if rate == sq.rate_bps:
            return
        sq.rate_bps = rate
        modelled = rate if rate is not None else self.dcqcn.line_rate_bps
        emulated = modelled / self.dcqcn.dilation
        self.socks.limiter.set_rate(sq.k, emulated)
        sndbuf, wait_s = socket_budget(self.setup, emulated)
        for sock in sq.socks:
            sock.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, sndbuf // 2)
        sq.req.rto_s = self.setup.transport.rto_s + wait_s
        if rate is not None and (sq.min_rate_bps is None or rate < sq.min_rate_bps):
            sq.min_rate_bps = rate
        series = sq.rates
        if len(series) < RATE_SERIES_MAX or abs(modelled - series[-1][1]) >= 0.01 * series[-1][1]:
            series.append([now, modelled])

    # ----------------------------------------------------------------- receive
    def receive(self, now: float) -> list[SendQp]:
        """Drain the receive socket; returns the send QPs whose timers or work changed.

        Packets come in records (fastpath.Receiver): one packet, or a run of in-order WRITE
        MIDDLE packets of one QP, which the responder takes in one step."""
        recv_by_qpn = self._recv_by_qpn
        touched: list[SendQp] = []
        for batch in self._receiver.batches():
            for qpn, psn, count, nbytes, aeth, ce, opcode, ackreq, malformed, has_aeth in batch:
                if malformed:
                    self.rx_malformed += 1
                    continue
                rq = recv_by_qpn.get(qpn) if opcode <= _LAST_WRITE else None
                if rq is None:  # not data for one of our receive QPs: ACK, NAK, CNP or stray
                    self._control_packet(opcode, qpn, psn, aeth if has_aeth else None, count,
                                         now, touched)
                    continue
                if opcode < _FIRST_WRITE:
                    self.rx_other_opcode += count
                    continue
                resp = rq.resp
                if now >= rq.next_point:  # rx_series: a point every RX_SERIES_INTERVAL_S
                    rq.add_point(now)
                if count == 1:
                    reply = resp.on_packet(opcode, psn, nbytes, ackreq)
                else:
                    reply = resp.on_run(psn, count, nbytes)
                rq.last_rx = now
                if reply is not None:
                    self._send_control(rq.acks.ack(reply[1], reply[0], resp.msn), rq.ack_addr,
                                       self.socks.control)
                if ce:  # one CNP at most per call: every packet here arrived at `now`
                    rq.ecn_ce += ce
                    if rq.np is not None and rq.np.on_ce(now):
                        if self._send_control(rq.cnp, rq.ack_addr, self.socks.cnp):
                            rq.cnp_sent += 1
        return touched

    def _control_packet(self, opcode: int, dest_qp: int, psn: int, aeth: int | None, count: int,
                        now: float, touched: list[SendQp]) -> None:
        """An ACK/NAK or a CNP for one of our send QPs (anything else is counted and dropped)."""
        sq = self._send_by_qpn.get(dest_qp)
        if sq is None:
            self.rx_unknown_qp += count
        elif opcode == roce.RC_ACKNOWLEDGE and aeth is not None:
            syndrome = aeth >> 24
            if syndrome == roce.AETH_NAK_PSN_SEQ:
                naks = sq.req.naks
                sq.req.on_nak(psn, now)
                if sq.req.naks > naks:
                    self.log(now, f"{_qp_name(sq)}: NAK (PSN sequence error), sending again "
                                  f"from PSN {psn:#08x}")
                self.resume(sq, now)
            else:
                sq.req.on_ack(psn, now)
            touched.append(sq)
        elif opcode == roce.CNP_OPCODE:
            sq.cnp_received += 1
            if sq.rp is not None:
                sq.rp.on_cnp(now)
                self._apply_rate(sq, now)
                if sq.cnp_received == 1:
                    self.log(now, f"{_qp_name(sq)}: first CNP, rate cut to {sq.rp.rate / 1e9:.2f} Gb/s "
                                  "(modelled)")
                touched.append(sq)
        else:
            self.rx_other_opcode += count

    def _send_control(self, payload, addr: tuple[str, int], sock: socket.socket) -> bool:
        try:
            sock.sendto(payload, addr)
            return True
        except OSError as e:
            if e.errno not in _FULL:
                raise
            self.control_send_errors += 1  # a reply the NIC could not queue is lost, as on hardware
            return False

    # ----------------------------------------------------------------- stats
    def pacing_stats(self) -> dict:
        sent = sum(sq.frame_bytes for sq in self.send_qps)
        busy = self.busy_s
        return {"rate_bps": self.rate_bps, "achieved_bps": sent * 8 / busy if busy > 0 else None,
                "busy_s": busy, "frame_bytes": sent, "full_socket_waits": self.full_socket_waits}

    def receive_stats(self) -> dict:
        return {"unknown_qp": self.rx_unknown_qp, "malformed": self.rx_malformed,
                "other_opcode": self.rx_other_opcode, "control_send_errors": self.control_send_errors,
                "timer_holds": self.timer_holds}


def _qp_name(sq: SendQp) -> str:
    return f"QP {sq.qp.src_qpn:#x} to {sq.qp.dst}"


def _unsent_bytes(sock: socket.socket) -> int:
    """Bytes of this socket's packets the kernel still holds (SIOCOUTQ: queued, not yet sent)."""
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), SIOCOUTQ, b"\0\0\0\0"))[0]


def _receive_socket(ip: str) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:  # a deep buffer absorbs bursts while the engine serves other hosts
        s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RECV_BUFFER_BYTES)
    except PermissionError:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECV_BUFFER_BYTES)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
    s.bind((ip, roce.ROCE_UDP_PORT))
    s.setblocking(False)
    return s


def _roce_socket(ip: str, port: int, tos: int, reuse: bool = False) -> socket.socket:
    """UDP checksum 0, DF set on an UNCONNECTED socket: Linux then writes IP ID 0, which the
    ICRC covers (fabric_emu.wire.roce)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    if reuse:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 1)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
    s.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
    s.bind((ip, port))
    s.setblocking(False)
    return s


def _control_socket(ip: str, tos: int) -> socket.socket:
    s = _roce_socket(ip, 0, tos)
    s.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, CONTROL_BUFFER_BYTES)
    return s


def _send_socket(ip: str, sport: int, mark: int, sndbuf: int, shared: bool = False) -> socket.socket:
    """A QP's socket: its fixed source port (the QP's ECMP entropy), RoCE DSCP + ECT(0), the
    QP's mark (its kernel rate class), and a send buffer that bounds what waits in the kernel.
    shared: the port may also be another QP's (spraying QPs' port sets can overlap); these
    sockets only send, so sharing a port is harmless."""
    s = _roce_socket(ip, sport, roce.TOS_ROCE, reuse=shared)
    s.setsockopt(socket.SOL_SOCKET, SO_MARK, mark)
    s.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, sndbuf // 2)  # the kernel doubles it
    return s

