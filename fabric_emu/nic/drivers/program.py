"""Drives a host's part of a Program (fabric_emu.workloads.program) on its NIC: collectives, pipelines,
training steps, several jobs at once.

Each operation starts when its dependencies are done: a send posts one RDMA WRITE message on
its channel's queue pairs (a channel's messages in their order), a recv waits until that
message has arrived whole, a compute holds for its time. Progress is read off the NIC's per-QP
message counters, as for the ring: the n-th message completed on a channel's QPs is the
channel's message n. A send is done when its last packet has left; the host has finished when
every operation is done and every message it sent is acknowledged.

A scale-up channel (via "scale-up": two GPUs of one server) has no queue pairs and sends no
packets: its messages go to the server's modelled domain (fabric_emu.nic.scale_up), and its
send and recv ops are both done at the time the message's last byte is delivered there.
"""

from __future__ import annotations

import heapq
from collections import deque

from fabric_emu.nic.config import ProgramConfig
from fabric_emu.nic.host_nic import HostNic
from fabric_emu.nic.scale_up import ScaleUpChannels
from fabric_emu.workloads.collectives import split_even


def channel_qps(cfg: ProgramConfig, host: str) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """Per channel, the indices of this host's send QPs (or receive QPs) that carry it.

    The QP table lists every fabric channel's queue pairs in channel order (build_qp_table
    with one edge per channel, fabric_channels), and the NIC keeps this host's in table order.
    Scale-up channels have none."""
    send: dict[int, list[int]] = {}
    recv: dict[int, list[int]] = {}
    ns = nr = 0
    for c, ch in enumerate(cfg.channels):
        if ch.via != "fabric":
            continue
        if ch.src == host:
            send[c] = list(range(ns, ns + ch.qps))
            ns += ch.qps
        if ch.dst == host:
            recv[c] = list(range(nr, nr + ch.qps))
            nr += ch.qps
    return send, recv


def fabric_channels(cfg: ProgramConfig) -> list[tuple[str, str, int]]:
    """(src, dst, qps) of each channel that has queue pairs, in channel order: build_qp_table's
    edges and counts."""
    return [(c.src, c.dst, c.qps) for c in cfg.channels if c.via == "fabric"]


class ProgramRunner:
    def __init__(self, cfg: ProgramConfig, host: str, nic: HostNic,
                 scale_up: ScaleUpChannels | None = None):
        self.nic = nic
        self.ops = cfg.ops
        self.channels = cfg.channels
        self.host = host
        self.scale_up = scale_up
        if scale_up is None and any(c.via != "fabric" and host in (c.src, c.dst) for c in cfg.channels):
            raise ValueError(f"{host} has scale-up channels but no server domain")
        self._send_qps, self._recv_qps = channel_qps(cfg, host)
        if (sum(map(len, self._send_qps.values())) != len(nic.send_qps)
                or sum(map(len, self._recv_qps.values())) != len(nic.recv_qps)):
            raise ValueError("the NIC's queue pairs do not match this host's channels")
        n = len(self.ops)
        self.times: list[list[float | None]] = [[None, None] for _ in range(n)]
        self._unmet = [len(o.deps) for o in self.ops]
        self._users: list[list[int]] = [[] for _ in range(n)]
        self._seq = [0] * n  # a send's or recv's message index on its channel
        counts: dict[tuple[str, int], int] = {}
        for i, o in enumerate(self.ops):
            for d in o.deps:
                self._users[d].append(i)
            if o.kind != "compute":
                key = (o.kind, o.channel)
                self._seq[i] = counts.get(key, 0)
                counts[key] = self._seq[i] + 1
        self._ready = deque(i for i in range(n) if not self._unmet[i])
        self._computing: list[tuple[float, int]] = []  # (end, op)
        self._to_post: dict[int, dict[int, int]] = {}  # channel -> {seq: op} ready to post
        self._posted: dict[int, int] = {}  # channel -> messages posted
        self._in_flight: dict[int, deque[int]] = {}  # channel -> posted sends not yet sent
        self._awaiting: dict[int, list[int]] = {}  # channel -> started recvs, in seq order
        self._messages = 0  # messages posted in all
        self._left = n
        # Scale-up channels: sends started (in seq order) and recvs waiting, per channel.
        self._su_flight: dict[int, list[int]] = {}
        self._su_awaiting: dict[int, list[int]] = {}

    @property
    def finished(self) -> bool:
        return not self._left and sum(sq.messages_done for sq in self.nic.send_qps) >= self._messages

    @property
    def wake_at(self) -> float | None:
        return self._computing[0][0] if self._computing else None

    def advance(self, now: float) -> None:
        """Record what completed and start every operation that may start now."""
        while True:
            self._check_sends(now)
            self._check_recvs(now)
            if self.scale_up is not None:
                self._check_scale_up()
            while self._computing and self._computing[0][0] <= now:
                self._done(heapq.heappop(self._computing)[1], now)
            if not self._ready:
                return
            while self._ready:
                self._start(self._ready.popleft(), now)

    def _start(self, i: int, now: float) -> None:
        o = self.ops[i]
        self.times[i][0] = now
        if o.kind == "compute":
            if o.seconds <= 0:
                self._done(i, now)
            else:
                heapq.heappush(self._computing, (now + o.seconds, i))
        elif self.channels[o.channel].via != "fabric":
            self._start_scale_up(i, now)
        elif o.kind == "send":
            self._to_post.setdefault(o.channel, {})[self._seq[i]] = i
            self._post(o.channel, now)
        else:
            waiting = self._awaiting.setdefault(o.channel, [])
            waiting.append(i)
            waiting.sort(key=self._seq.__getitem__)

    def _post(self, c: int, now: float) -> None:
        """Post the channel's ready sends in their order (a later one waits for the earlier)."""
        ready = self._to_post[c]
        nxt = self._posted.get(c, 0)
        qps = self._send_qps[c]
        while nxt in ready:
            i = ready.pop(nxt)
            for q, nbytes in zip(qps, split_even(self.ops[i].nbytes, len(qps))):
                self.nic.post_write(q, nbytes, now)
            self._in_flight.setdefault(c, deque()).append(i)
            nxt += 1
            self._messages += len(qps)
        self._posted[c] = nxt

    def _check_sends(self, now: float) -> None:
        send_qps = self.nic.send_qps
        for c, flying in self._in_flight.items():
            if not flying:
                continue
            sent = min(send_qps[q].messages_sent for q in self._send_qps[c])
            while flying and self._seq[flying[0]] < sent:
                self._done(flying.popleft(), now)

    def _check_recvs(self, now: float) -> None:
        recv_qps = self.nic.recv_qps
        for c, waiting in self._awaiting.items():
            if not waiting:
                continue
            got = min(recv_qps[q].messages for q in self._recv_qps[c])
            while waiting and self._seq[waiting[0]] < got:
                self._done(waiting.pop(0), now)

    def _start_scale_up(self, i: int, now: float) -> None:
        """A send's message enters the server's domain now; a recv waits for its delivery."""
        o = self.ops[i]
        c = o.channel
        if o.kind == "send":
            ch = self.channels[c]
            self.scale_up.send(c, self._seq[i], ch.src, ch.dst, o.nbytes, now)
        waiting = (self._su_flight if o.kind == "send" else self._su_awaiting).setdefault(c, [])
        waiting.append(i)
        waiting.sort(key=self._seq.__getitem__)  # delivered in seq order, whatever the start order

    def _check_scale_up(self) -> None:
        """Sends and recvs whose message the domain delivered: done at the delivery time."""
        delivered = self.scale_up.delivered
        for ops in (self._su_flight, self._su_awaiting):
            for c, waiting in ops.items():
                times = delivered.get(c)
                while waiting and times and self._seq[waiting[0]] < len(times):
                    i = waiting.pop(0)
                    # A recv started after its message was delivered is done as it starts.
                    self._done(i, max(times[self._seq[i]], self.times[i][0]))

    def _done(self, i: int, now: float) -> None:
        self.times[i][1] = now
        self._left -= 1
        for u in self._users[i]:
            self._unmet[u] -= 1
            if not self._unmet[u]:
                self._ready.append(u)

    def op_log(self) -> list[list[float | None]]:
        return [[None if t is None else round(t, 6) for t in pair] for pair in self.times]
