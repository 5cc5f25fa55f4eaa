"""The lossless ports of one running fabric: BPF programs, maps and the PFC daemon, up and down.

Order (RoutedFabric.up): once the interfaces exist (Fabric.build), launch() loads the programs
and starts the daemon; once the class trees exist (Fabric.start), start() configures and
attaches the programs and waits for the daemon; down: the daemon first (it writes its pause
log), then the interfaces go with the fabric and the pinned maps with the run record's paths.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from functools import cached_property
from pathlib import Path

from fabric_emu.cc.charges import charge_audit, signed
from fabric_emu.cc.deadlock import waits_from_pairs
from fabric_emu.ports import datapath
from fabric_emu.ports.layout import NPRIO, PORT_ECN, PORT_PFC
from fabric_emu.ports.model import PortPlan, PortSettings, bpf_config, nic_receive_config
from fabric_emu.ports.pfcd import Config, DaemonPort
from fabric_emu.ports import queues
from fabric_emu.ports.queues import LOSSLESS
from fabric_emu.kernel.shaping import IPRoutePool
from fabric_emu.state.records import RunRecord

READY_TIMEOUT_S = 20.0
# A cut link's queue empties when the kernel purges it (its carrier went) or its closed gate's
# pause runs out (no refresh comes over a cut link): well under a second at any shipped setting.
CUT_QUEUE_TIMEOUT_S = 3.0
CUT_POLL_S = 0.01
CUT_SETTLE_S = 0.02

# The lossless accounting as read: signed bytes per switch port, and per (ingress, egress) pair.
Charges = tuple[dict[str, int], dict[tuple[str, str], int]]


def settled_charges(read: Callable[[], Charges], timeout_s: float = 1.0, step_s: float = 0.1) -> dict:
    """The lossless accounting once two readings step_s apart agree (what was in flight has
    landed), or the last reading after timeout_s: summary.json's `pfc_accounting`. read: this
    machine's ports (LosslessPorts.charges), or every machine's of a split fabric."""
    last, deadline = read(), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(step_s)
        now = read()
        if now == last:
            return charge_audit(*now, settled=True)
        last = now
    return charge_audit(*last, settled=False)


class LosslessPorts:
    def __init__(self, ports: PortPlan, record: RunRecord, workdir: Path,
                 remote_peers: dict[int, int] | None = None):
        self.ports = ports
        self.remote_peers = remote_peers or {}  # one machine's share of a fabric: see pfcd.Config
        self.record = record
        self.workdir = workdir
        self.pins = datapath.pin_dir(record.run_id)
        self.maps: datapath.PortMaps | None = None
        self.daemon: subprocess.Popen | None = None
        self.stats_path = workdir / "pfcd-stats.json"
        self.netns_of: dict[str, str | None] = {}
        self._traffic_go: float | None = None  # wall clock of the traffic's GO, once told

    def launch(self, netns_of: dict[str, str | None]) -> None:
        """Load the programs (maps pinned for this run) and start the PFC daemon, without
        waiting for it: it boots (~0.2 s of imports) while the switches start and the classes
        are built. It needs only the maps and the interfaces; no port pauses before start()."""
        self.netns_of = netns_of
        self.record.paths.append(str(self.pins))  # before anything is pinned: kill -9 safe
        self.record.save()
        datapath.load(self.record.run_id)
        self.maps = datapath.PortMaps(self.pins)
        self._spawn_daemon()

    def start(self) -> None:
        """Configure and attach the programs on every link end (their class trees built), then
        wait for the daemon launch() started."""
        assert self.maps is not None, "launch() first"
        self._configure_switch_ports()
        datapath.attach(self.pins, self.ports.ends, self.netns_of, self.maps)
        self._wait_daemon()

    def _spawn_daemon(self) -> None:
        pfc = self.ports.switch.pfc
        netns_of = self.netns_of
        cfg = Config(pins=str(self.pins), dilation=self.ports.dilation,
                     quanta=pfc.quanta if pfc else 0xFFFF, stats_path=str(self.stats_path), ports=[
                         DaemonPort(e.id, e.node, e.intf, e.peer_id, e.role, e.gbps, e.emulated_bps,
                                    self.ports.mtu, self.ports.settings(e).fifo_limits[3],
                                    netns_of.get(e.node), e.role == "switch" and bool(pfc and pfc.enabled))
                         for e in self.ports.ends], watchdog=self.ports.watchdog,
                     watched=[e.id for e in self.ports.watched()], seed=self.ports.watchdog_seed,
                     nic_stall_guard_s=self.ports.nic_stall_guard_s,
                     nic_rx_xon=self.ports.nic_receive[3] if self.ports.nic_receive else None,
                     remote_peers=self.remote_peers)
        path = self.workdir / "pfcd.config.json"
        path.write_text(cfg.dump())
        log = open(self.workdir / "pfcd.log", "w")
        self.daemon = subprocess.Popen([sys.executable, "-m", "fabric_emu.ports.pfcd", str(path)],
                                       stdout=subprocess.PIPE, stderr=log, text=True,
                                       start_new_session=True)  # Ctrl-C reaches the runner only
        log.close()
        self.record.add_process(self.daemon.pid, "pfc-daemon")

    def _wait_daemon(self) -> None:
        assert self.daemon is not None
        ready, _, _ = select.select([self.daemon.stdout], [], [], READY_TIMEOUT_S)
        if not ready or self.daemon.stdout.readline().strip() != "READY":
            raise RuntimeError("the PFC daemon did not start (see logs/pfcd.log)")

    def reconfigure(self, switch: PortSettings) -> None:
        """New ECN and PFC settings on every switch port, with the fabric up and no traffic (a
        lab's knobs): the programs read the map per packet; the PFC daemon, which knows which
        ports send pauses and with what quanta, is restarted. The kernel FIFOs stay as built."""
        assert self.maps is not None
        self.ports = replace(self.ports, switch=replace(switch, fifo_limits=self.ports.switch.fifo_limits))
        self._configure_switch_ports()
        self.restart_daemon()

    def _configure_switch_ports(self) -> None:
        """Every switch port's config words; those facing a host also model its NIC's receive
        buffer (or not), starting empty."""
        roles = {e.id: e.role for e in self.ports.ends}
        for end in self.ports.ends:
            if end.role != "switch":
                continue
            host_facing = roles.get(end.peer_id) == "host"  # a peer on another machine is a switch
            datapath.configure(self.maps, end.id,
                               bpf_config(self.ports.switch, orphan=host_facing and self.ports.orphan_host_frames))
            if host_facing:
                datapath.configure(self.maps, end.id, {**nic_receive_config(self.ports), "nic_rx_occ": 0,
                                                       "nic_rx_last": 0, "nic_rx_state": 0})

    def set_watchdog(self, timers, ports: str, seed: int) -> None:
        """A new PFC watchdog (None: none) with the fabric up and no traffic (a lab's `pfcwd`):
        the daemon runs it, so it is restarted."""
        self.ports = replace(self.ports, watchdog=timers, watchdog_ports=ports, watchdog_seed=seed)
        self.restart_daemon()

    def restart_daemon(self) -> dict:
        """A fresh PFC daemon; returns what the stopped one logged (a lab run's pauses)."""
        stats = self._stop_daemon()
        old = self.daemon.pid if self.daemon is not None else None
        self.record.processes = [p for p in self.record.processes if p.pid != old]
        self._spawn_daemon()
        self._wait_daemon()
        return stats

    def daemon_returncode(self) -> int | None:
        """The daemon's exit status (None while it runs): the supervisor's probe."""
        return self.daemon.poll() if self.daemon is not None else None

    def recover_daemon(self) -> dict:
        """A fresh daemon after this one died mid-run (the supervisor's restart, traffic flowing).

        The dead one took its state along: the gates it held closed would stay closed for ever
        (no timer left to reopen them) and a watchdog's drop holds would stay on. Both are undone
        here, from the ports map, before the new daemon starts; it then re-asserts what still
        holds (a port above xoff pauses its upstream again, a storming NIC pauses again). What the
        dead one logged in memory (pause intervals, reaction times) is lost; the map's counters
        (frames sent and received, paused time) are not. Kept outside the daemon's own module on
        purpose: this is launch plumbing."""
        assert self.maps is not None
        t = self.maps.table
        now_ns = time.monotonic_ns()
        reopened = []
        with IPRoutePool() as pool:
            for e in self.ports.ends:
                since = t.get(e.id, "paused_since", LOSSLESS)
                if since:
                    queues.set_gate(e.intf, e.emulated_bps, self.ports.mtu,
                                    self.ports.settings(e).fifo_limits[LOSSLESS], True,
                                    self.netns_of.get(e.node), pool=pool)
                    t.add(e.id, "paused_ns", max(0, now_ns - since), LOSSLESS)
                    t.set(e.id, "paused_since", 0, LOSSLESS)
                    reopened.append(e.intf)
        held = [e.intf for e in self.ports.ends if t.get(e.id, "wd_drop")]
        for e in self.ports.ends:  # the watchdog's drop action (Daemon._hold), undone
            t.set(e.id, "wd_drop", 0)
            t.set(e.id, "peer_wd_drop", 0)
        old = self.daemon.pid if self.daemon is not None else None
        self.record.processes = [p for p in self.record.processes if p.pid != old]
        self.stats_path.unlink(missing_ok=True)  # a half-written log of the dead one, if any
        self._spawn_daemon()
        self._wait_daemon()
        if self.ports.watchdog is not None and self._traffic_go is not None:  # its polls count from now
            self.daemon.send_signal(signal.SIGUSR2)
        return {"gates_reopened": reopened, "watchdog_holds_released": held, "pid": self.daemon.pid}

    def _stop_daemon(self) -> dict:
        stats: dict = {}
        died = self.daemon is not None and self.daemon.poll() is not None  # before we stopped it
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.send_signal(signal.SIGTERM)
            try:
                self.daemon.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
                self.daemon.wait()
        if self.stats_path.exists():
            stats = json.loads(self.stats_path.read_text())
            self.stats_path.unlink()  # a restarted daemon's log is its own
        if died:
            stats["died"] = f"exit code {self.daemon.returncode}"
        return stats

    def stop(self) -> dict:
        """Stop the daemon; returns what it logged (pause intervals, reaction times)."""
        stats = self._stop_daemon()
        if self.maps is not None:
            self.maps.close()
            self.maps = None
        return stats

    def set_storm(self, host: str, on: bool) -> None:
        """Start or end a PFC storm of `host`'s NIC: its switch port's peer_stalled (the port
        programs drop what reaches the stalled NIC), then the daemon, woken, sends the pauses."""
        assert self.maps is not None and self.daemon is not None
        ports = [e.peer_id for e in self.ports.ends if e.role == "host" and e.node == host]
        if not ports:
            raise ValueError(f"no NIC of host {host!r}")
        for port in ports:  # a NIC's peer is its leaf's port
            self.maps.table.set(port, "peer_stalled", int(on))
        self.daemon.send_signal(signal.SIGUSR1)

    def cut_link(self, intfs: list[str], cut: bool) -> None:
        """Mark these switch ports' link cut (their egress programs drop what Open vSwitch still
        sends them, giving a lossless frame's bytes back) or whole again (bpf/port.c, link_cut)."""
        assert self.maps is not None
        for e in self.ports.ends:
            if e.intf in intfs:
                self.maps.table.set(e.id, "link_cut", int(cut))

    def switch_link(self, intfs: list[str], up: bool, wire: Callable[[bool], None]) -> int:
        """Cut these switch ports' link, or mend it, with `wire` taking the cable down or up:
        marked cut before the cable goes and unmarked once it is back, so no frame is charged to
        a link that cannot carry it; then what the queues held is given back (give_back_cut).
        Returns the bytes given back (0 when mended)."""
        if up:
            wire(True)
            self.cut_link(intfs, False)
            return 0
        self.cut_link(intfs, True)
        wire(False)
        return self.give_back_cut(intfs)

    def give_back_cut(self, intfs: list[str]) -> int:
        """Once these switch ports' link is cut (wire down, link_cut set): wait for their queues
        to empty (the kernel purges a queue whose carrier went; a closed gate holds its frames
        until then), then give back the lossless bytes still charged to pairs whose egress is one
        of them: frames lost in the queue or on the wire, which no program saw (bpf/port.c,
        give_back). Returns those bytes; 0 if the queues did not empty in time. The caller
        (switch_link) is synchronous, so the link cannot come back during the wait."""
        assert self.maps is not None
        cut = {e.id: e.intf for e in self.ports.ends if e.intf in intfs}
        deadline = time.monotonic() + CUT_QUEUE_TIMEOUT_S
        with IPRoutePool() as pool:
            while any(c.backlog_packets for intf in cut.values()
                      for c in queues.class_stats(intf, pool=pool).values()):
                if time.monotonic() > deadline:
                    return 0
                time.sleep(CUT_POLL_S)
        time.sleep(CUT_SETTLE_S)  # frames sent just before the cut land, and are credited there
        given = 0
        fd = datapath.program_fd(self.pins, "give_back")
        try:
            for (in_id, out_id), n in self.maps.pairs().items():
                if out_id in cut:
                    datapath.give_back(fd, in_id, out_id, n)
                    given += n
        finally:
            os.close(fd)
        for port_id in cut:  # nothing is queued there now: what the programs count as queued was lost
            for prio in range(NPRIO):
                self.maps.table.set(port_id, "queue", 0, prio)
        return given

    def traffic_starts(self, go: float) -> None:
        """Tell the daemon, at `go` (wall clock), that traffic starts: the watchdog's polls count
        from there."""
        self._traffic_go = go
        daemon = self.daemon
        if self.ports.watchdog is None or daemon is None:
            return
        timer = threading.Timer(max(0.0, go - time.time()),
                                lambda: daemon.poll() is None and daemon.send_signal(signal.SIGUSR2))
        timer.daemon = True
        timer.start()

    def end_storms(self) -> None:
        """Every NIC storm still on ends (traffic is over; a lab's next run starts clean)."""
        assert self.maps is not None
        stalled = [e.id for e in self.ports.ends if e.role == "switch" and self.maps.table.get(e.id, "peer_stalled")]
        for port in stalled:
            self.maps.table.set(port, "peer_stalled", 0)
        if stalled and self.daemon is not None:
            self.daemon.send_signal(signal.SIGUSR1)

    def reset_high_water(self) -> None:
        """Zero every port's high-water marks (deepest queue, most lossless bytes held), so they
        count from now: a lab's runs share one fabric, and a mark left by the run before would be
        read as this run's (counters are differenced; a maximum cannot be)."""
        assert self.maps is not None
        t = self.maps.table
        for e in self.ports.ends:
            for p in range(NPRIO):
                t.set(e.id, "max_queue", 0, p)
                t.set(e.id, "max_held", 0, p)

    def counters(self) -> dict[str, dict[str, int]]:
        """Every port's BPF and daemon counters, by interface name."""
        assert self.maps is not None
        return {e.intf: self.maps.counters(e.id) for e in self.ports.ends}

    def to_hosts(self) -> tuple[int, int]:
        """(bytes, packets) the switches have sent to the host NICs so far, every class: what
        the fabric has delivered, live (a few map reads, no system call)."""
        assert self.maps is not None
        roles = {e.id: e.role for e in self.ports.ends}
        t = self.maps.table
        ends = [e.id for e in self.ports.ends if e.role == "switch" and roles.get(e.peer_id) == "host"]
        return (sum(t.get(i, "tx_bytes", p) for i in ends for p in range(NPRIO)),
                sum(t.get(i, "tx_packets", p) for i in ends for p in range(NPRIO)))

    def installed(self) -> list[dict]:
        """The thresholds each switch port runs with, read back from the map."""
        assert self.maps is not None
        rows = []
        for e in self.ports.ends:
            if e.role != "switch":
                continue
            got = datapath.installed(self.maps, e.id)
            rows.append({"switch": e.node, "port": e.port, "intf": e.intf,
                         **{f"limit_p{p}": got["limit"][p] for p in (0, 3, 6)},
                         "ecn": bool(got["flags"] & PORT_ECN), "kmin": got["kmin"], "kmax": got["kmax"],
                         "pmax": round(got["pmax32"] / 2**32, 6),
                         "pfc": bool(got["flags"] & PORT_PFC), "xoff": got["xoff"], "xon": got["xon"],
                         "headroom": got["headroom"]})
        return rows

    def backlogs_now(self) -> dict[str, dict[int, int]]:
        """Bytes queued per class at every switch port at this instant (the programs' own count,
        equal to the qdiscs' backlog plus frames on the wire; see tests/integration/test_ports.py)."""
        assert self.maps is not None
        t = self.maps.table
        return {e.intf: {p: t.get(e.id, "queue", p) for p in (0, 3, 6)}
                for e in self.ports.ends if e.role == "switch"}

    def waits_now(self) -> tuple[dict[tuple[str, str, str], int], set[tuple[str, str]]]:
        """What the deadlock detector samples (fabric_emu.cc.deadlock): lossless bytes each switch
        X holds now per (X, the neighbour Y they came from, the neighbour Z they wait to go to),
        and the egresses (X, Z) that Z is pausing now."""
        assert self.maps is not None
        t = self.maps.table
        names = self._switch_port_names
        paused = [i for i in names if t.get(i, "paused_since", LOSSLESS)]
        # Without a pause there is no wait: the pair map (a bpf(2) call per pair) is left alone.
        return waits_from_pairs(self.maps.pairs() if paused else {}, names, paused)

    def charges(self) -> Charges:
        """The lossless accounting now (fabric_emu.cc.charges): signed bytes charged per switch
        port, and per (ingress, egress) switch port, by interface name."""
        assert self.maps is not None
        t = self.maps.table
        intf = {e.id: e.intf for e in self.ports.ends}
        held = {e.intf: signed(t.get(e.id, "held", LOSSLESS)) for e in self.ports.ends if e.role == "switch"}
        pairs = {(intf[i], intf[o]): n for (i, o), n in self.maps.pairs(signed=True).items() if i in intf and o in intf}
        return held, pairs

    def settled_charges(self) -> dict:
        """summary.json's `pfc_accounting` (settled_charges below), with how many lossless frames
        the switch ports charged as their links handed them over and how many only at their tc
        ingress, since the ports were installed (bpf/port.c, "Charging at the hand-off")."""
        assert self.maps is not None
        t = self.maps.table
        switch = self._switch_port_names
        return {**settled_charges(self.charges),
                "charged_frames": {"on_handoff": sum(t.get(i, "handoff_charges") for i in switch),
                                   "at_ingress": sum(t.get(i, "ingress_charges") for i in switch)}}

    @cached_property
    def _switch_port_names(self) -> dict[int, tuple[str, str]]:
        """Each switch port's id -> (its switch, the node at its far end)."""
        node = {e.id: e.node for e in self.ports.ends}
        return {e.id: (e.node, node.get(e.peer_id, "")) for e in self.ports.ends if e.role == "switch"}

    def paused_now(self) -> dict[str, bool]:
        """Whether each port's lossless class is paused at this instant (for samplers)."""
        assert self.maps is not None
        t = self.maps.table
        return {e.intf: bool(t.get(e.id, "paused_since", 3)) for e in self.ports.ends}

