"""Read a running fabric now, cheaply, from its live manifest (fabric_emu.live.manifest).

Per snapshot: OpenFlow port statistics (one `ovs-ofctl dump-ports` per switch, the source of
ports.csv), ONE netlink dump of the root namespace's qdiscs (the class FIFOs' drops and the
RoCE class's tc backlog; every switch port lives there), the port programs' BPF map through
mmap (ECN marks, admission drops, PFC pause counts and state, the PFC watchdog's state and
NIC storms: no system call), the NIC
engines' once-a-second files, the controller's GET /lb, and /proc for CPU. The receive-socket
drops of ovs-vswitchd need `ss` walking /proc, so they are refreshed only every few seconds.
Needs root (the pinned BPF maps, OVS).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from pyroute2 import IPRoute

from fabric_emu.measure import counters
from fabric_emu.measure.counters import PortCounters
from fabric_emu.measure.fidelity import CPU_SATURATED, _cpu_times
from fabric_emu.live.manifest import LiveManifest, LivePort
from fabric_emu.cc.deadlock import waits_from_pairs
from fabric_emu.live.snapshot import LOSSLESS, PRIORITIES, DeadlockCycle, PortSample, QpSample, Snapshot, deadlock_cycles
from fabric_emu.ports import queues
from fabric_emu.ports.layout import PortTable
from fabric_emu.measure.thread_cpu import CLK_TCK, ovs_vswitchd_pid, read_threads

SOCKET_DROPS_EVERY_S = 5.0
LB_TIMEOUT_S = 0.5


def counter_row(c: PortCounters, dilation: float) -> dict[str, int]:
    """A port's counters as ports.csv has them, plus the sum of ECN marks over classes."""
    row = c.row(dilation)
    for k in ("switch", "port", "intf", "peer", "kind"):
        row.pop(k)
    row["ecn_marked"] = c.ecn_marked
    return row


def final_row(row: dict) -> dict:
    """A ports.csv row (PortCounters.row()) as counter_row has it."""
    out = {k: v for k, v in row.items() if k not in ("switch", "port", "intf", "peer", "kind")}
    out["ecn_marked"] = sum(row.get(f"ecn_marked_p{p}", 0) for p in PRIORITIES)
    return out


def storm_fields(table: PortTable, port_id: int) -> dict:
    """A switch port's PFC watchdog and storm words as PortSample's fields. Not in
    PORT_COUNTERS (that would add ports.csv columns): the daemon writes wd_* itself, counted
    from its own start, and a run (each of a lab's runs) starts a fresh daemon that zeroes them
    before traffic, so they count from traffic start as the other counters do."""
    return {"stormed": bool(table.get(port_id, "wd_status")),
            "storms_detected": table.get(port_id, "wd_detected"),
            "storms_restored": table.get(port_id, "wd_restored"),
            "peer_storming": bool(table.get(port_id, "peer_stalled"))}


def final_storms(table: PortTable, ports: list) -> dict[str, dict[str, int]]:
    """The storm counts of every LivePort when traffic ends, for the manifest: the views show
    them with the final rows (nothing storms or is stormed once traffic is over)."""
    out = {}
    for lp in ports:
        f = storm_fields(table, lp.id)
        out[lp.intf] = {"storms_detected": f["storms_detected"], "storms_restored": f["storms_restored"]}
    return out


def waits_of(pairs: dict[tuple[int, int], int], ports: list[LivePort],
             paused: dict[str, dict[int, bool]]) -> tuple[dict[tuple[str, str, str], int], set[tuple[str, str]]]:
    """The deadlock detector's (held, paused) from the port program's pair map (lossless bytes
    per (ingress port id, egress port id), PortMaps.pairs) and the ports' pause state, named by
    the manifest's ports as LosslessPorts.waits_now names them: held[(X, Y, Z)] bytes switch X
    holds from neighbour Y for neighbour Z; paused {(X, Z)}: X's egress toward Z is paused."""
    return waits_from_pairs(pairs, {lp.id: (lp.switch, lp.peer) for lp in ports},
                            {lp.id for lp in ports if paused.get(lp.intf, {}).get(LOSSLESS)})


def deadlocks_now(maps, ports: list[LivePort], paused: dict[str, dict[int, bool]]) -> list[DeadlockCycle]:
    """The cycles now; the pair map (one bpf(2) call per held pair) is walked only when some
    lossless egress is paused: without a pause there is no wait, let alone a cycle."""
    if not any(p.get(LOSSLESS) for p in paused.values()):
        return []
    held, stopped = waits_of(maps.pairs(), ports, paused)
    return deadlock_cycles(held, stopped, {lp.switch for lp in ports})


class LiveReader:
    """Snapshots of one run; keeps its handles (BPF map, netlink socket) between reads."""

    def __init__(self, manifest_path: str | Path) -> None:
        self.path = Path(manifest_path)
        self.manifest = LiveManifest.load(self.path)
        self._maps = None
        self._ipr: IPRoute | None = None
        self._ifindex: dict[str, int] = {}
        self._socket_drops: dict[str, int] = {}
        self._socket_drops_at = 0.0
        self._cpu: tuple[int, int] | None = None
        self._ovs: tuple[int, float, dict] | None = None  # pid, when, thread ticks
        self._lb: dict = {}

    def close(self) -> None:
        if self._maps is not None:
            self._maps.close()
            self._maps = None
        if self._ipr is not None:
            self._ipr.close()
            self._ipr = None

    # ------------------------------------------------------------------ snapshot
    def snapshot(self) -> Snapshot:
        notes: list[str] = []
        try:
            self.manifest = LiveManifest.load(self.path)
        except (OSError, ValueError):
            notes.append("the run's live manifest is gone (the run ended); showing the last one read")
        m = self.manifest
        taken = time.time()
        if m.final is not None:  # traffic over: the run's own final counters, exactly ports.csv
            by_intf = {r["intf"]: r for r in m.final}
            storms = m.final_storms or {}
            ports = [self._sample(lp, final_row(by_intf.get(lp.intf, {})), {}, {}, storms.get(lp.intf))
                     for lp in m.ports]
            taken = m.ended or taken
            cycles = []
        else:
            ports = self._live_ports(notes)
            cycles = self._deadlocks(ports, notes)
        snap = Snapshot(run_id=m.run_id, experiment=m.experiment, taken=taken, phase=m.phase,
                        dilation=m.dilation, go=m.go, load_balancing=self._lb_mode(),
                        congestion_control=m.congestion_control, ports=ports, qps=self._qps(),
                        fidelity=self._fidelity(), baseline=m.baseline is not None, notes=notes,
                        deadlocks=cycles)
        return snap

    def deadlocks_now(self) -> list[DeadlockCycle]:
        """The cycles in the fabric now, whatever the run's phase (a run over keeps its final
        counters, but the buffers a deadlock holds stay held after it): the lab's `deadlocks`.
        OSError when the maps cannot be read."""
        from fabric_emu.ports.datapath import PortMaps

        if self._maps is None:
            self._maps = PortMaps(Path(self.manifest.pins))
        t = self._maps.table
        paused = {lp.intf: {LOSSLESS: bool(t.get(lp.id, "paused_since", LOSSLESS))} for lp in self.manifest.ports}
        return deadlocks_now(self._maps, self.manifest.ports, paused)

    def paused_now(self) -> list[str]:
        """The switch ports whose lossless egress is paused now (after deadlocks_now)."""
        t = self._maps.table
        return [lp.intf for lp in self.manifest.ports if t.get(lp.id, "paused_since", LOSSLESS)]

    def _deadlocks(self, ports: list[PortSample], notes: list[str]) -> list[DeadlockCycle]:
        """PFC deadlock cycles now, from the pause state just read and the pair map."""
        if self._maps is None:
            return []
        try:
            return deadlocks_now(self._maps, self.manifest.ports, {p.intf: p.paused for p in ports})
        except OSError as e:
            notes.append(f"no lossless buffer pairs ({e.strerror or e}); deadlocks are not shown")
            return []

    def _sample(self, lp, row: dict, queue_bytes: dict[int, int], paused: dict[int, bool],
                storm: dict | None = None) -> PortSample:
        return PortSample(lp.switch, lp.port, lp.intf, lp.peer, lp.kind, lp.gbps, row, queue_bytes, paused,
                          **(storm or {}))

    def _live_ports(self, notes: list[str]) -> list[PortSample]:
        m = self.manifest
        bpf, state, storms = self._bpf(notes)
        kernel = self._qdiscs(notes)
        socket_drops = self._socket_drops_now(notes)
        ovs: dict[str, dict[int, dict[str, int]]] = {}
        for sw in sorted({lp.switch for lp in m.ports}):
            try:
                ovs[sw] = counters.port_stats(sw)
            except Exception as e:  # noqa: BLE001 - a switch going away mid-read is a note
                notes.append(f"{sw}: no port statistics ({type(e).__name__})")
                ovs[sw] = {}
        base = {(b["switch"], b["port"]): PortCounters(**b) for b in (m.baseline or [])}
        out = []
        for lp in m.ports:
            k = kernel.get(lp.intf, {})
            c = counters.port_counters(lp.switch, lp.port, lp.intf, lp.peer, lp.kind, ovs[lp.switch].get(lp.port, {}),
                                       socket_drops.get(lp.intf, 0), {p: k.get(p, (0, 0))[0] for p in PRIORITIES},
                                       bpf.get(lp.intf, {}))
            if (lp.switch, lp.port) in base:
                c = c.minus(base[(lp.switch, lp.port)])
            out.append(self._sample(lp, counter_row(c, m.dilation), {p: k.get(p, (0, 0))[1] for p in PRIORITIES},
                                    state.get(lp.intf, {}), storms.get(lp.intf)))
        return out

    def _bpf(self, notes: list[str]) -> tuple[dict[str, dict[str, int]], dict[str, dict[int, bool]], dict[str, dict]]:
        """The port programs' counters, the PFC pause state and the watchdog's state and NIC
        storms (storm_fields), by interface (mmap reads)."""
        from fabric_emu.ports.datapath import PortMaps

        try:
            if self._maps is None:
                self._maps = PortMaps(Path(self.manifest.pins))
            maps = self._maps
            cnt = {lp.intf: maps.counters(lp.id) for lp in self.manifest.ports}
            paused = {lp.intf: {p: bool(maps.table.get(lp.id, "paused_since", p)) for p in PRIORITIES}
                      for lp in self.manifest.ports}
            storms = {lp.intf: storm_fields(maps.table, lp.id) for lp in self.manifest.ports}
            return cnt, paused, storms
        except OSError as e:
            notes.append(f"no BPF counters ({e.strerror or e}); ECN and PFC figures are missing")
            return {}, {}, {}

    def _qdiscs(self, notes: list[str]) -> dict[str, dict[int, tuple[int, int]]]:
        """{intf: {priority: (drops, backlog bytes)}} of every class qdisc, from one dump."""
        try:
            if self._ipr is None:
                self._ipr = IPRoute()
            if not self._ifindex:
                self._ifindex = {ln.get_attr("IFLA_IFNAME"): ln["index"] for ln in self._ipr.get_links()}
            name_of = {i: n for n, i in self._ifindex.items()}
            wanted = {lp.intf for lp in self.manifest.ports}
            handles = {queues.qdisc_handle(p): p for p in PRIORITIES}
            out: dict[str, dict[int, tuple[int, int]]] = {}
            for q in self._ipr.get_qdiscs():
                intf, prio = name_of.get(q["index"]), handles.get(q["handle"])
                if intf not in wanted or prio is None:
                    continue
                stats = q.get_attr("TCA_STATS2")
                queue = stats.get_attr("TCA_STATS_QUEUE") if stats else None
                if queue:
                    out.setdefault(intf, {})[prio] = (queue["drops"], queue["backlog"])
            return out
        except Exception as e:  # noqa: BLE001 - netlink trouble costs one refresh's queue figures
            notes.append(f"no qdisc statistics ({type(e).__name__}: {e})")
            self._ifindex = {}
            return {}

    def _socket_drops_now(self, notes: list[str]) -> dict[str, int]:
        if time.monotonic() - self._socket_drops_at >= SOCKET_DROPS_EVERY_S:
            try:
                self._socket_drops = counters.ovs_socket_drops()
            except Exception as e:  # noqa: BLE001
                notes.append(f"no socket drops ({type(e).__name__})")
            self._socket_drops_at = time.monotonic()
        return self._socket_drops

    # ------------------------------------------------------------------ NICs, LB, CPU
    def _qps(self) -> list[QpSample]:
        """Every sending QP, from the engines' live files (their last second)."""
        sends, recvs = [], {}
        for f in sorted(Path(self.manifest.workdir).glob("engine*.live.json")):
            try:
                d = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            for host, h in d.get("hosts", {}).items():
                sends += [(host, q) for q in h.get("send", [])]
                recvs.update({(host, r["qpn"]): r for r in h.get("recv", [])})
        out = []
        for host, q in sends:
            r = recvs.get((q["dst"], q.get("remote_qpn")), {})
            out.append(QpSample(host, q["qpn"], q["dst"], q["udp_src"], q["frame_bytes"], q["bytes_sent"],
                                q["packets"], q["retransmitted"], q["cnp_received"], q["tx_bps"],
                                q["dcqcn_rate_bps"], r.get("ecn_ce", 0), r.get("cnp_sent", 0)))
        return out

    def _lb_mode(self) -> str:
        from fabric_emu.fabric.events import RestError, rest_call

        if self.manifest.final is None and self.manifest.controller_url:
            try:
                self._lb = rest_call(self.manifest.controller_url, timeout=LB_TIMEOUT_S)
            except (RestError, OSError, ValueError):
                pass  # keep the last answer
        return self._lb.get("mode", self.manifest.load_balancing)

    def _fidelity(self) -> dict:
        """Whole-machine CPU busy (saturated at fidelity.CPU_SATURATED) and OVS's busiest thread,
        since the previous snapshot."""
        out: dict = {}
        busy, total = _cpu_times()
        if self._cpu is not None and total > self._cpu[1]:
            frac = (busy - self._cpu[0]) / (total - self._cpu[1])
            out.update(cpu_busy=round(frac, 3), cpu_saturated=frac >= CPU_SATURATED)
        self._cpu = (busy, total)
        pid = ovs_vswitchd_pid()
        threads = read_threads(pid) if pid else None
        now = time.monotonic()
        if threads is not None:
            if self._ovs is not None and self._ovs[0] == pid and now > self._ovs[1]:
                before = self._ovs[2]
                fracs = [(t - before[tid][1]) / CLK_TCK / (now - self._ovs[1])
                         for tid, (_, t) in threads.items() if tid in before]
                out["ovs_thread_busy"] = round(max(fracs, default=0.0), 3)
            self._ovs = (pid, now, threads)
        # OVS's thread busy is shown, not judged: its CPU time alone does not say it is behind
        # (fabric_emu.measure.ovs_stats), and reading its batch statistics would clear the ones the
        # run's own fidelity monitor reads. The run's summary gives the full verdict.
        out["saturated"] = bool(out.get("cpu_saturated"))
        return out


def snapshot_json(snap: Snapshot) -> str:
    return json.dumps(snap.to_dict(), indent=1)

