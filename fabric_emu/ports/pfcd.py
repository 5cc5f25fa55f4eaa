"""The PFC daemon of a run: `python -m fabric_emu.ports.pfcd CONFIG.json`.

The BPF programs account bytes and spot threshold crossings per packet; this process turns
them into frames and gates, with the pure state machines of fabric_emu.cc.pfc:

* XOFF on a switch's ingress port -> a real PFC frame (0x8808, opcode 0x0101, class 3, the
  configured quanta) out of that port, refreshed every half pause while it stays asserted;
  XON -> a PFC frame with quanta 0. Frames bypass the port's qdisc, as a MAC sends them.
* A PFC frame arriving at a port (seen by that port's ingress program) -> close the port's
  lossless gate (its TBF, see fabric_emu.ports.queues) for quanta x 512 bit times at the
  modelled rate x dilation, reopen it on expiry or on quanta 0.

* A host NIC in a PFC storm (its switch port's peer_stalled, set by the run's events) ->
  XOFF with full quanta from that NIC, refreshed every half pause, never XON.
* A NIC whose modelled receive buffer crossed xoff (EV_NIC_XOFF from its switch port's
  program) -> XOFF from that NIC, refreshed; XON once the buffer, drained at the host's rate,
  is below xon (a time the daemon computes: no frame arrives to tell).
* The PFC watchdog (fabric_emu.ports.watchdog), when the run has one: every poll it samples
  each switch port's lossless queue and carries out its action on a storm: drop (the port's
  gate stays open, its pauses are ignored, the programs drop its lossless frames both ways),
  forward (gate open, pauses ignored, the port no longer pauses its own upstream) or alert.

It writes the pause frames sent and received and the paused time into the ports map (the
fields after "counters (PFC daemon)" in bpf/port.c), so any reader sees them live, and at exit a
JSON file with every pause interval and the reaction time of every pause (threshold crossing in
the kernel to the upstream gate closed).

Protocol: prints READY once its sockets are open; SIGTERM or SIGINT ends it (exit 0).
"""

from __future__ import annotations

import fcntl
import gc
import json
import math
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from pyroute2 import netns as pr_netns

from fabric_emu.cc.pfc import MAX_QUANTA, RECONCILE_S, PauseReceiver, PauseSender, REFRESH_FRACTION, pause_seconds, pfc_frame
from fabric_emu.cc.pfcwd import Timers
from fabric_emu.kernel import bpfsys, rtnl
from fabric_emu.ports import queues
from fabric_emu.ports import late_pauses
from fabric_emu.ports.datapath import PortMaps
from fabric_emu.ports.layout import EV_NIC_XOFF, EV_PFC_RX, EV_XOFF, EV_XON, NO_PORT, Event
from fabric_emu.ports.responder import OP_CLOSE, OP_FAST_OFF, OP_FAST_ON, OP_OPEN, SRC_FAST, GateSpec, Report, Responder
from fabric_emu.ports.watchdog import PortWatchdogs, clear_status
from fabric_emu.kernel.shaping import IPRoutePool, link_index

SIOCGIFFLAGS, IFF_UP, IFF_RUNNING = 0x8913, 0x1, 0x40
SOL_PACKET = 263
PACKET_QDISC_BYPASS = 20
LOSSLESS = queues.LOSSLESS
HOST_COUNTS = ("peer_drops", "nic_rx_xoffs", "nic_rx_drops")  # kept per NIC at its leaf's port
IDLE_POLL_S = 0.2
REALTIME_PRIORITY = 10  # SCHED_FIFO; the loop only ever blocks in epoll, so it cannot hog a core
RESPONDER_PRIORITY = REALTIME_PRIORITY + 1  # its fast closes go before the daemon's round
# Sent through a port's qdisc right after its gate opens (by the responder): a TBF that was
# closed is not rescheduled by `tc change`, so without a new enqueue the class would sit idle
# until some unrelated timer fired (~180 ms measured). A MAC control frame with the reserved
# opcode 0 is consumed by the peer's MAC (its ingress program) and never delivered.
KICK_OPCODE = b"\x00\x00"


@dataclass(frozen=True)
class DaemonPort:
    id: int
    node: str
    intf: str
    peer_id: int
    role: str
    gbps: float
    emulated_bps: float
    mtu: int
    lossless_fifo: int
    netns: str | None
    pfc: bool  # sends PFC as an ingress port (switch ports when PFC is on)


@dataclass
class Config:
    pins: str
    dilation: float
    quanta: int
    stats_path: str
    ports: list[DaemonPort] = field(default_factory=list)
    watchdog: Timers | None = None
    watched: list[int] = field(default_factory=list)  # the switch ports it watches
    seed: int = 0  # the switches' poll phases
    nic_stall_guard_s: float | None = None  # modelled; None: storming NICs never stop
    nic_rx_xon: int | None = None  # the NICs' receive buffers resume below this (None: not modelled)
    # A fabric over several machines (issue 19): a pause frame from a port on another machine
    # names that port (its global id, port.c's stitch_out); this is its peer here, the port to pause.
    remote_peers: dict[int, int] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str) -> "Config":
        raw = json.loads(Path(path).read_text())
        raw["ports"] = [DaemonPort(**p) for p in raw["ports"]]
        raw["remote_peers"] = {int(k): v for k, v in raw.get("remote_peers", {}).items()}
        if raw.get("watchdog"):
            raw["watchdog"] = Timers(**raw["watchdog"])
        return cls(**raw)

    def dump(self) -> str:
        from dataclasses import asdict
        return json.dumps(asdict(self), indent=1)


def paused_by(ports: dict[int, DaemonPort], remote_peers: dict[int, int], sender: int) -> int:
    """The port here that a pause frame sent by port `sender` pauses (its peer), NO_PORT if none:
    the sender is a port here, or one on another machine whose peer is here (remote_peers)."""
    peer = ports[sender].peer_id if sender in ports else remote_peers.get(sender, NO_PORT)
    return peer if peer in ports else NO_PORT


def tag_mac(port_id: int) -> bytes:
    """The source MAC of frames a port sends itself (0e:fe:ff:ff:<port id>)."""
    return bytes([0x0E, 0xFE, 0xFF, 0xFF, port_id >> 8, port_id & 0xFF])


def kick_frame(port_id: int) -> bytes:
    """The frame that restarts a port's reopened lossless queue (KICK_OPCODE)."""
    return (bytes.fromhex("0180c2000001") + tag_mac(port_id) + b"\x88\x08" + KICK_OPCODE).ljust(60, b"\0")


def _socket_in(netns: str | None, bypass: bool) -> socket.socket:
    """An AF_PACKET socket created inside netns (the fd keeps working from any thread)."""
    made: list[socket.socket | BaseException] = []

    def create() -> None:
        try:
            if netns is not None:
                pr_netns.setns(netns, flags=0, fork=False)
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
            if bypass:
                s.setsockopt(SOL_PACKET, PACKET_QDISC_BYPASS, 1)
            made.append(s)
        except BaseException as e:  # re-raised below
            made.append(e)

    worker = threading.Thread(target=create)
    worker.start()
    worker.join()
    if isinstance(made[0], BaseException):
        raise made[0]
    return made[0]


class Daemon:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.maps = PortMaps(Path(cfg.pins))
        self.ring = bpfsys.RingBuffer(self.maps.events_fd)
        self.ports = {p.id: p for p in cfg.ports}
        self.senders = {p.id: PauseSender(cfg.quanta, REFRESH_FRACTION * self._pause_s(p, cfg.quanta))
                        for p in cfg.ports if p.pfc}
        self.receivers = {p.id: PauseReceiver() for p in cfg.ports}
        # One socket of each kind per namespace, not per port: closing a packet socket waits
        # for an RCU grace period (~20 ms), which made a 128-port daemon take 4 s to exit.
        namespaces = sorted({p.netns for p in cfg.ports}, key=lambda ns: ns or "")
        self.netlink = {ns: rtnl.netlink_socket(ns) for ns in namespaces}
        self.tx = _socket_in(None, bypass=True)  # PFC frames: switch ports are in the root namespace
        with IPRoutePool() as pool:
            self.gates = {p.id: queues.Gate(self.netlink[p.netns], p.intf, link_index(pool.get(p.netns), p.intf),
                                            p.emulated_bps, p.mtu, p.lossless_fifo)
                          for p in cfg.ports}
        # The responder makes every gate change, and closes a local upstream's gate on an XOFF
        # crossing (port -> that gate) by itself, while the watchdog does not hold either port.
        upstreams = {x: paused_by(self.ports, {}, x) for x in self.senders}
        self.fast = {x: gate for x, gate in upstreams.items() if gate != NO_PORT}
        self.fast_on = dict.fromkeys(self.fast, True)
        ns_index = {ns: i for i, ns in enumerate(namespaces)}
        self.responder = Responder(
            Path(cfg.stats_path).with_name("responder.conf"), cfg.pins, RESPONDER_PRIORITY,
            [ns or "/proc/self/ns/net" for ns in namespaces],
            [GateSpec(p.id, ns_index[p.netns], g.index, g.msgs[True], g.msgs[False], kick_frame(p.id))
             for p, g in ((self.ports[i], g) for i, g in self.gates.items())], self.fast)
        self.horizon = 0  # the latest port program event read (ns): the cause of every command
        self.commanded: set[int] = set()  # gates commanded while handling the current event
        self.responder_counts = {"workers": self.responder.workers, "fast_closes": 0, "stale": 0}
        # ingress port -> (ns its XOFF crossed in the kernel, ns the daemon handled it), unanswered
        self.crossed_at: dict[int, tuple[int, int]] = {}
        self.intervals: dict[str, list[list[float]]] = {}
        self.reactions_s: list[float] = []
        self.worst_split: dict[str, float] = {}  # the slowest reaction, stage by stage (seconds)
        self.stage_max: dict[str, float] = {}  # each stage's longest over every pause (seconds)
        # The daemon's longest send of a frame, tc change and round of its loop (ns): a send also
        # runs the network receive work pending on its CPU (softirqs run when it re-enables
        # them), and a round is what an event that arrives meanwhile waits at most.
        self.longest_ns = {"frame": 0, "kick": 0, "gate": 0, "loop": 0}
        self.frames_sent = self.frames_received = self.events = 0
        self.late_wakes = LateWakes()
        self.late_pauses = late_pauses.LatePauses()
        self.next_reconcile = 0.0
        self.errors: list[str] = []
        self.outbox: list[tuple[int, int]] = []  # (port, quanta): frames to send this round
        # PFC storms: host port -> the pauses it sends while its NIC storms; their log
        self.storms: dict[int, PauseSender] = {}
        self.storm_log: list[dict] = []
        self.storm_now: dict[int, dict] = {}  # host port -> its storm in progress (in storm_log)
        self.storm_tx: dict[str | None, socket.socket] = {}
        self.nic_senders: dict[int, PauseSender] = {}  # host port -> its receive buffer's pauses
        # host NICs whose leaf port is in the map: storms and receive buffers are counted there
        self.host_ports = [p for p in cfg.ports if p.role == "host" and p.peer_id in self.ports]
        self.counted_before = {name: self._at_leaf(name) for name in HOST_COUNTS}  # the map outlives a lab's daemons
        clear_status(self.maps.table, self.ports)  # the map outlives a lab's daemons
        watched = {p.id: (p.intf, p.node) for p in cfg.ports if p.id in set(cfg.watched) and p.pfc}
        self.watchdog = (PortWatchdogs(cfg.watchdog, watched, self.maps.table, cfg.dilation, cfg.seed)
                         if cfg.watchdog is not None else None)
        self.mitigated: dict[int, str] = {}  # port -> the watchdog's action holding it

    def _pause_s(self, port: DaemonPort, quanta: int) -> float:
        return pause_seconds(quanta, port.gbps, self.cfg.dilation)

    # ------------------------------------------------------------------ loop
    def run(self, stop: threading.Event, wakeup: int | None = None) -> None:
        """wakeup: the pipe Python writes each signal's number to (SIGUSR1: a NIC's storm flag
        changed; SIGUSR2: traffic starts, the watchdog's polls count from now)."""
        poller = select.epoll()
        poller.register(self.ring.fd, select.EPOLLIN)
        poller.register(self.responder.fileno(), select.EPOLLIN)
        if wakeup is not None:
            poller.register(wakeup, select.EPOLLIN)
        while not stop.is_set():
            start = time.monotonic_ns()
            self._drain(time.monotonic())
            deadline = self._timers(time.monotonic())
            self._flush()  # the frames, once this round's gates are set
            waited = time.monotonic()
            timeout = IDLE_POLL_S if deadline is None else max(0.0, min(IDLE_POLL_S, deadline - waited))
            self._took("loop", start)  # its own work between two waits: events wait this long at most
            ready = poller.poll(timeout)
            if not ready:  # woke for its timer: how late, past the millisecond epoll rounds up to
                self.late_wakes.woke(time.monotonic() - (waited + math.ceil(timeout * 1e3) / 1e3))
            for fd, _ in ready:
                if fd == wakeup:
                    signals = os.read(wakeup, 512)
                    if self.watchdog is not None and signal.SIGUSR2 in signals:
                        self.watchdog.anchor(time.monotonic())
                    self._storms(time.monotonic())
                    self._flush()
        poller.close()

    def _drain(self, now: float) -> None:
        for report in self.responder.reports():
            self._applied(report)
        for raw in self.ring.records():
            self.events += 1
            ev = Event.unpack(raw)
            self.horizon = max(self.horizon, ev.time_ns)
            self.commanded.clear()
            try:
                self._handle(ev, now)
            except OSError as e:  # a port vanishing during teardown, say
                self.errors.append(f"event {ev}: {e}")
            gate = self.fast.get(ev.port) if ev.type == EV_XOFF else None
            if gate is not None and gate not in self.commanded:
                # The responder may have closed it on this crossing, which the daemon did not
                # honour (the link cut, the watchdog holding a port): the gate as the daemon has it.
                self._gate(gate, "close" if self.receivers[gate].paused else "open")

    def _handle(self, ev: Event, now: float) -> None:
        if ev.type == EV_XOFF and ev.port in self.senders:
            if self.mitigated.get(ev.port) == "forward":
                return  # the class is lossy on this port while it is stormed
            self.crossed_at.setdefault(ev.port, (ev.time_ns, time.monotonic_ns()))
            self._send(ev.port, self.senders[ev.port].on_xoff(now))
        elif ev.type == EV_XON and ev.port in self.senders:
            self._send(ev.port, self.senders[ev.port].on_xon(now))
        elif ev.type == EV_NIC_XOFF and ev.port in self.ports:
            self._nic_xoff(self.ports[ev.port].peer_id, now)
        elif ev.type == EV_PFC_RX and ev.vector & (1 << LOSSLESS):
            receiver = paused_by(self.ports, self.cfg.remote_peers, ev.port)
            if receiver == NO_PORT:
                return
            self.frames_received += 1
            self.maps.table.add(receiver, "pause_rx", 1, LOSSLESS)
            if self.watchdog is not None:
                self.watchdog.on_pause_frame(receiver, now)
            if ev.port in self.senders:
                return  # a switch port's frame to a port here: honoured as it was sent (_send)
            self._honour(receiver, ev.quanta, now, ev.port)

    def _honour(self, receiver: int, quanta: int, now: float, sender: int | None = None) -> None:
        """A pause frame for port `receiver` (from port `sender`) takes effect: its gate closes for
        the quanta (or opens)."""
        if receiver in self.mitigated and self.mitigated[receiver] != "alert":
            return  # counted, not honoured: the watchdog holds this queue
        action = self.receivers[receiver].on_frame(now, self._pause_s(self.ports[receiver], quanta))
        self._gate(receiver, action, sender)

    def _reconcile(self, now: float) -> None:
        """Bring every sender in line with its port's xoff_state (events lost on the way)."""
        for port_id, s in self.senders.items():
            if self.mitigated.get(port_id) != "forward":
                self._send(port_id, s.on_level(bool(self.maps.table.get(port_id, "xoff_state")), now))
        self._storms(now)
        if self.cfg.nic_rx_xon is not None:  # an XOFF the ring buffer lost leaves nic_rx_state set
            for port in self.host_ports:
                if self.maps.table.get(port.peer_id, "nic_rx_state") and port.id not in self.nic_senders:
                    self._nic_xoff(port.id, now)

    def _timers(self, now: float) -> float | None:
        if now >= self.next_reconcile:
            self._reconcile(now)
            self.next_reconcile = now + RECONCILE_S
        deadlines = []
        for port_id, s in self.senders.items():
            self._send(port_id, s.on_timer(now))
            if s.next_refresh is not None:  # asserted
                deadlines.append(s.next_refresh)
        # Wake to reconcile only while a pause is asserted (a lost XON would hold it forever); a
        # lost XOFF is caught at the next event or idle poll. An idle real-time daemon stays
        # asleep: each of its wake-ups preempts the fabric's own work on that CPU.
        if deadlines:
            deadlines.append(self.next_reconcile)
        for port_id, r in self.receivers.items():
            self._gate(port_id, r.on_timer(now))
            if r.paused_until is not None:
                deadlines.append(r.paused_until)
        for host, s in self.nic_senders.items():
            if s.asserted:
                deadlines.append(self._nic_drain(host, s, now))
        for port_id, storm in list(self.storms.items()):
            if self._guarded(port_id, now):
                continue
            self._send(port_id, storm.on_timer(now))
            deadlines.append(storm.next_refresh)
            if self.cfg.nic_stall_guard_s is not None:
                deadlines.append(self.storm_now[port_id]["on_s"] + self.cfg.nic_stall_guard_s * self.cfg.dilation)
        if self.watchdog is not None:
            self._watchdog_poll(now)
            deadlines.append(self.watchdog.next_poll())
        return min(deadlines, default=None)

    # ------------------------------------------------------------------ storms and the watchdog
    def _storms(self, now: float) -> None:
        """Start or end each host NIC's storm as its switch port's peer_stalled says."""
        for port in self.host_ports:
            stalled = bool(self.maps.table.get(port.peer_id, "peer_stalled"))
            if stalled and port.id not in self.storm_now:
                storm = PauseSender(MAX_QUANTA, REFRESH_FRACTION * self._pause_s(port, MAX_QUANTA))
                self.storms[port.id] = storm
                self.storm_now[port.id] = {"nic": port.node, "intf": port.intf, "on_s": now, "off_s": None,
                                           "frames": 0}
                self.storm_log.append(self.storm_now[port.id])
                self._send(port.id, storm.on_xoff(now))
            elif not stalled and port.id in self.storm_now:
                self.storms.pop(port.id, None)  # it recovers: no XON, its last pause runs out
                self.storm_now.pop(port.id)["off_s"] = now

    def _nic_xoff(self, host: int, now: float) -> None:
        """A NIC's receive buffer crossed xoff: it pauses its leaf (refreshed until it drains)."""
        if host not in self.ports:
            return
        s = self.nic_senders.get(host)
        if s is None:
            s = self.nic_senders[host] = PauseSender(
                self.cfg.quanta, REFRESH_FRACTION * self._pause_s(self.ports[host], self.cfg.quanta))
        if not s.asserted:
            self._send(host, s.on_xoff(now))

    def _nic_drain(self, host: int, s: PauseSender, now: float) -> float:
        """Resume the leaf once the NIC's buffer has drained below xon, else refresh; returns
        when to look again. The buffer's bytes are the program's count minus what the host took
        since (its rate, emulated bytes per second; bpf_ktime_get_ns is CLOCK_MONOTONIC)."""
        t, x = self.maps.table, self.ports[host].peer_id
        rate = max(1, t.get(x, "nic_rx_rate"))
        held = t.get(x, "nic_rx_occ") - (time.monotonic_ns() - t.get(x, "nic_rx_last")) * rate / 1e9
        xon = self.cfg.nic_rx_xon or 0
        if held < xon:
            t.set(x, "nic_rx_state", 0)  # the program may cross xoff again from here
            self._send(host, s.on_xon(now))
            return now + IDLE_POLL_S
        self._send(host, s.on_timer(now))
        return min(s.next_refresh or now, now + (held - xon) / rate)

    def _at_leaf(self, name: str) -> dict[str, int]:
        """A counter the programs keep for each host NIC at its leaf's port, by the NIC's interface."""
        return {p.intf: self.maps.table.get(p.peer_id, name) for p in self.host_ports}

    def _counted(self, name: str) -> dict[str, int]:
        """That counter since this daemon started (a lab's fabric keeps its map between runs)."""
        before = self.counted_before[name]
        return {intf: n - before.get(intf, 0) for intf, n in self._at_leaf(name).items()}

    def _guarded(self, port_id: int, now: float) -> bool:
        """The NIC's stall prevention (mlx5): paused this long without draining, it stops sending
        pauses (its last one runs out) and counts an error event; it stays stalled."""
        guard = self.cfg.nic_stall_guard_s
        entry = self.storm_now[port_id]
        if guard is None or now - entry["on_s"] < guard * self.cfg.dilation:
            return False
        del self.storms[port_id]
        entry["guard_stopped_s"] = now
        entry["tx_pause_storm_error_events"] = 1
        return True

    def _watchdog_poll(self, now: float) -> None:
        assert self.watchdog is not None
        action = self.watchdog.timers.action
        for port_id, what in self.watchdog.due(now):
            if what == "storm":
                self.mitigated[port_id] = action
                self._update_fast()  # before its gate opens below: no fast close after that
                if action == "alert":
                    continue
                if action == "drop":
                    self._hold(port_id, True)
                elif port_id in self.senders:  # forward: stop pausing its own upstream
                    self._send(port_id, self.senders[port_id].on_xon(now))
                receiver = self.receivers[port_id]
                if receiver.paused:
                    receiver.paused_until = None
                    self._gate(port_id, "open")
                self.watchdog.episodes[-1]["mitigated_s"] = time.monotonic()
            else:
                if self.mitigated.pop(port_id, None) == "drop":
                    self._hold(port_id, False)
                self._update_fast()

    def _hold(self, port_id: int, drop: bool) -> None:
        """The drop action on a port's lossless queue: its egress drops, and its ingress's at the
        peer's egress when the peer is a switch port (a NIC's frames still enter: see bpf/port.c)."""
        self.maps.table.set(port_id, "wd_drop", int(drop))
        peer = self.ports.get(self.ports[port_id].peer_id)
        if peer is not None and peer.role == "switch":
            self.maps.table.set(peer.id, "peer_wd_drop", port_id + 1 if drop else 0)

    # ------------------------------------------------------------------ actions
    def _send(self, port_id: int, quanta_list: list[int]) -> None:
        """Queue pause frames out of a port, sent once the round's gates are set (_flush): a send
        also runs the receive work pending on its CPU (softirqs, 2 ms and more measured), and
        gates waited behind it. A switch port's frame to a port on this machine also takes
        effect here and now, as its upstream's MAC would on receipt: the frame still crosses
        (counted and captured there), but the gate no longer waits for it."""
        if not quanta_list:
            return
        port = self.ports[port_id]
        # A link taken down or cut carries no frame (a MAC without a link sends none): the peer's
        # pause runs out, and a crossing has no pause to time. Switch ports only: a NIC's port
        # is in its host's namespace, and its link is never cut.
        if port.netns is None and not self._carrier(port):
            self.crossed_at.pop(port_id, None)
            return
        peer = paused_by(self.ports, {}, port_id) if port_id in self.senders else NO_PORT
        for quanta in quanta_list:
            if peer != NO_PORT:
                self._honour(peer, quanta, time.monotonic(), port_id)
            self.outbox.append((port_id, quanta))
            if quanta == 0:
                self.crossed_at.pop(port_id, None)

    def _carrier(self, port: DaemonPort) -> bool:
        """Whether a frame out of this switch port reaches its peer: its link not cut (the
        runner marks link_cut in the map before the wire goes down; IFF_RUNNING would follow
        only once the kernel's link watch has run, up to a second later), the port up (a link
        taken down) and running. One ioctl that takes no lock (an ethtool query would take the
        RTNL, which every tc change needs too), no netlink round trip."""
        if self.maps.table.get(port.id, "link_cut"):
            return False
        try:
            ifreq = fcntl.ioctl(self.tx.fileno(), SIOCGIFFLAGS, struct.pack("16sH22x", port.intf.encode(), 0))
        except OSError:  # the port is gone
            return False
        flags = struct.unpack_from("H", ifreq, 16)[0]
        return bool(flags & IFF_UP and flags & IFF_RUNNING)

    def _flush(self) -> None:
        """The round's pause frames, once its gate commands are out: a send runs the receive
        work pending on its CPU. (The responder kicks each gate it opens: a kick also runs its
        port's queue, 0.04 ms at the median, up to 2 ms measured under busy loops.)"""
        for port_id, quanta in self.outbox:
            port = self.ports[port_id]
            start = time.monotonic_ns()
            try:
                self._tx_socket(port).sendto(pfc_frame(tag_mac(port_id), quanta, LOSSLESS), (port.intf, 0))
            except OSError as e:  # a port vanishing during teardown, say
                self.errors.append(f"frame out of {port.intf}: {e}")
                continue
            self._took("frame", start)
            self.frames_sent += 1
            if port_id in self.storm_now:
                self.storm_now[port_id]["frames"] += 1
            self.maps.table.add(port_id, "pause_tx", 1, LOSSLESS)
        self.outbox.clear()

    def _took(self, what: str, start_ns: int) -> int:
        now_ns = time.monotonic_ns()
        self._span(what, start_ns, now_ns)
        return now_ns

    def _span(self, what: str, start_ns: int, end_ns: int) -> None:
        """One call of the daemon's or the responder's: its longest, and a late pause's company."""
        self.longest_ns[what] = max(self.longest_ns[what], end_ns - start_ns)
        self.late_pauses.call(what, start_ns, end_ns)

    def _tx_socket(self, port: DaemonPort) -> socket.socket:
        """Switch ports send from the root namespace; a storming NIC from its host's."""
        if port.netns is None:
            return self.tx
        if port.netns not in self.storm_tx:
            self.storm_tx[port.netns] = _socket_in(port.netns, bypass=True)
        return self.storm_tx[port.netns]

    def _gate(self, port_id: int, action: str | None, sender: int | None = None) -> None:
        """Have the responder open or close a port's gate, caused by every event read so far;
        `sender`: the port whose pause frame closes it, if one does (its crossing is the pause's
        origin). The books are kept when the responder reports the change (_applied)."""
        if action is None:
            return
        self.commanded.add(port_id)
        crossed = self.crossed_at.pop(sender, None) if sender is not None and action == "close" else None
        origin, handled = crossed if crossed is not None else (0, 0)
        self.responder.command(OP_OPEN if action == "open" else OP_CLOSE, port_id, self.horizon, origin, handled)

    def _applied(self, r: Report) -> None:
        """A gate change the responder made (or refused), in the order it made them."""
        if r.error:
            self.errors.append(f"gate of {self.ports[r.port].intf}: {os.strerror(-r.error)}")
        self.responder_counts["stale"] += r.stale
        if not r.changed:
            return
        self.responder_counts["fast_closes"] += r.source == SRC_FAST
        self._span("gate", r.start_ns, r.applied_ns)
        if r.kick_ns:
            self._span("kick", r.applied_ns, r.applied_ns + r.kick_ns)
        port, now_ns = self.ports[r.port], r.applied_ns
        if self.watchdog is not None:
            self.watchdog.on_gate(r.port, not r.open, now_ns / 1e9)
        if not r.open:  # the responder keeps paused_since and paused_ns in the map itself
            self.intervals.setdefault(port.intf, []).append([now_ns / 1e9, None])
            if r.origin:
                split = split_reaction((r.origin, r.handled), (None, None), now_ns)
                self.reactions_s.append(split["total_s"])
                self.late_pauses.pause(r.origin, now_ns, split)
                if split["total_s"] > self.worst_split.get("total_s", -1.0):
                    self.worst_split = split
                self.stage_max = max_by_stage(self.stage_max, split)
        else:
            self.intervals[port.intf][-1][1] = now_ns / 1e9

    def _update_fast(self) -> None:
        """The responder closes a gate on a crossing only while the watchdog holds neither the
        crossing port (forward: it no longer pauses) nor the gate's port (its pauses ignored)."""
        for x, gate in self.fast.items():
            on = self.mitigated.get(x) != "forward" and self.mitigated.get(gate, "alert") == "alert"
            if on != self.fast_on[x]:
                self.fast_on[x] = on
                self.responder.command(OP_FAST_ON if on else OP_FAST_OFF, x, self.horizon)

    # ------------------------------------------------------------------ end
    def close(self) -> dict:
        for report in self.responder.close():  # no gate changes but the daemon's from here
            self._applied(report)
        now_ns = time.monotonic_ns()
        for port_id, port in self.ports.items():  # close the books on pauses still running
            since = self.maps.table.get(port_id, "paused_since", LOSSLESS)
            if since:
                self.maps.table.add(port_id, "paused_ns", now_ns - since, LOSSLESS)
                self.maps.table.set(port_id, "paused_since", 0, LOSSLESS)
                self.intervals[port.intf][-1][1] = now_ns / 1e9
                try:  # a lab restarts the daemon with the fabric up: leave no gate closed
                    self.gates[port_id].set(True)
                except OSError:
                    pass
        events_lost = sum(self.maps.table.get(p, "events_lost") for p in self.ports)
        watchdog = self.watchdog.report() if self.watchdog is not None else None
        for port_id, action in self.mitigated.items():  # a lab restarts the daemon with the fabric up
            if action == "drop":
                self._hold(port_id, False)
        for entry in self.storm_log:
            if entry["off_s"] is None:
                entry["off_s"] = now_ns / 1e9
        xoffs, drops = self._counted("nic_rx_xoffs"), self._counted("nic_rx_drops")
        nic_rx = ({intf: {"xoffs": xoffs[intf], "drops": drops[intf]} for intf in xoffs}
                  if self.cfg.nic_rx_xon is not None else None)
        storm_drops = {intf: n for intf, n in self._counted("peer_drops").items() if n > 0}
        for s in (self.tx, *self.netlink.values(), *self.storm_tx.values()):
            s.close()
        self.ring.close()
        self.maps.close()
        return {"intervals": self.intervals, "reaction_s": self.reactions_s,
                "worst_reaction": self.worst_split, "stage_max": self.stage_max,
                "longest_call_ms": {k: round(v / 1e6, 3) for k, v in self.longest_ns.items()},
                "late_wake": self.late_wakes.report(), "late_pauses": self.late_pauses.report(),
                "frames_sent": self.frames_sent, "frames_received": self.frames_received,
                "events": self.events, "errors": self.errors[:20],
                "events_lost": events_lost, "watchdog": watchdog,
                "storms": self.storm_log, "storm_nic_drops": storm_drops, "nic_receive": nic_rx,
                "responder": self.responder_counts}


def split_reaction(crossed: tuple[int, int], frame_seen: tuple[int | None, int | None], closed_ns: int) -> dict[str, float]:
    """Where one pause's reaction went: (kernel crossing, daemon handled it), (pause frame seen
    by the upstream port's program, daemon handled that; None, None when the gate did not wait
    for the frame), gate closed; nanosecond stamps of CLOCK_MONOTONIC, which
    bpf_ktime_get_ns also reads."""
    (crossed_ns, xoff_ns), (rx_ns, rx_handled_ns) = crossed, frame_seen
    if rx_ns is None or rx_handled_ns is None:
        rx_ns = rx_handled_ns = xoff_ns
    return {"total_s": (closed_ns - crossed_ns) / 1e9,
            "to_daemon_s": (xoff_ns - crossed_ns) / 1e9,  # ring buffer + wake-up
            "frame_s": (rx_ns - xoff_ns) / 1e9,  # frame built, sent, across the veth
            "frame_to_daemon_s": (rx_handled_ns - rx_ns) / 1e9,
            "gate_s": (closed_ns - rx_handled_ns) / 1e9}  # the tc change (rtnl)


def max_by_stage(so_far: dict[str, float], split: dict[str, float]) -> dict[str, float]:
    """Each stage's longest so far, with one more pause's split: a tail in one stage (a frame
    late out of a softirq backlog, say) shows even when another pause was slowest in total."""
    return {k: max(v, so_far.get(k, v)) for k, v in split.items()}


class LateWakes:
    """How late the daemon woke for its own timers: a wake-up is what every pause waits for, and
    one that comes milliseconds late means this machine did not run the daemon (a kernel section
    it cannot preempt, a syscall of its own running the CPU's pending receive work, a virtual
    CPU not scheduled), whatever fabric-emu does. Costs nothing per packet."""

    STALL_S = 1e-3

    def __init__(self) -> None:
        self.wakes = self.stalls = 0
        self.worst_s = 0.0

    def woke(self, late_s: float) -> None:
        self.wakes += 1
        self.stalls += late_s > self.STALL_S
        self.worst_s = max(self.worst_s, late_s)

    def report(self) -> dict:
        return {"wakes": self.wakes, "over_1ms": self.stalls, "max_ms": round(self.worst_s * 1e3, 3)}


def merge_late_wakes(parts: list[dict]) -> dict | None:
    found = [p["late_wake"] for p in parts if p.get("late_wake")]
    if not found:
        return None
    return {"wakes": sum(f["wakes"] for f in found), "over_1ms": sum(f["over_1ms"] for f in found),
            "max_ms": max(f["max_ms"] for f in found)}


class FullCollections:
    """The cyclic garbage collector's full (generation 2) passes while the daemon serves pauses:
    how many and the longest. A full pass walks every tracked object, pyroute2's included: ~15 ms
    on this daemon's heap as imported, a pause held up that long (a CI run's one 7.4 ms pause in
    ~1,200). settle() runs one and freezes what is left, so later passes walk only what the
    daemon allocated since: what it records shows they stay short."""

    def __init__(self) -> None:
        self.count = 0
        self.longest_ns = 0
        self._started = 0

    def settle(self) -> None:
        gc.collect()
        gc.freeze()  # the imported modules and the daemon's set-up: never walked again
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._started = time.monotonic_ns()
        else:
            self.count += 1
            self.longest_ns = max(self.longest_ns, time.monotonic_ns() - self._started)

    def report(self) -> dict:
        return {"count": self.count, "longest_ms": round(self.longest_ns / 1e6, 3)}


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def merge_stats(parts: list[dict]) -> dict:
    """The PFC daemons' stats of a fabric over several machines as one daemon's (issue 19): a
    port's pause intervals are on its machine's monotonic clock (the same clock on one kernel;
    on separate machines pauses.csv would need their offsets)."""
    parts = [p for p in parts if p]
    if len(parts) <= 1:
        return parts[0] if parts else {}
    worst = [p["worst_reaction"] for p in parts if p.get("worst_reaction")]

    def most(key: str) -> dict:
        out: dict = {}
        for p in parts:
            for k, v in (p.get(key) or {}).items():
                out[k] = max(v, out.get(k, v))
        return out

    def union(key: str) -> dict | None:
        found = [p[key] for p in parts if p.get(key) is not None]
        return {k: v for d in found for k, v in d.items()} if found else None

    return {"intervals": union("intervals") or {}, "reaction_s": [r for p in parts for r in p.get("reaction_s", [])],
            "worst_reaction": max(worst, key=lambda w: w.get("total_s", 0.0)) if worst else {},
            "stage_max": most("stage_max"), "longest_call_ms": most("longest_call_ms"),
            "responder": {k: sum((p.get("responder") or {}).get(k, 0) for p in parts)
                          for k in ("workers", "fast_closes", "stale")},
            "late_wake": merge_late_wakes(parts), "late_pauses": late_pauses.merge(parts),
            **{k: sum(p.get(k, 0) for p in parts) for k in ("frames_sent", "frames_received", "events", "events_lost")},
            "errors": [e for p in parts for e in p.get("errors", [])][:20],
            "watchdog": None, "storms": [s for p in parts for s in p.get("storms", [])],
            "storm_nic_drops": union("storm_nic_drops") or {}, "nic_receive": union("nic_receive")}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m fabric_emu.ports.pfcd CONFIG.json", file=sys.stderr)
        return 2
    cfg = Config.load(argv[0])
    try:  # a pause must not wait behind the agents and OVS for a CPU: that delay costs headroom
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(REALTIME_PRIORITY))
    except (PermissionError, OSError) as e:
        print(f"warning: no real-time priority ({e}); pauses may take effect late", file=sys.stderr)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)  # a signal wakes the loop's epoll at once
    signal.signal(signal.SIGUSR1, lambda *_: None)  # a NIC's storm flag changed
    signal.signal(signal.SIGUSR2, lambda *_: None)  # traffic starts
    daemon = Daemon(cfg)
    collections = FullCollections()
    collections.settle()
    print("READY", flush=True)
    try:
        daemon.run(stop, wake_r)
    finally:
        stats = daemon.close()
        stats["gc_full"] = collections.report()
        write_atomic(Path(cfg.stats_path), json.dumps(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
