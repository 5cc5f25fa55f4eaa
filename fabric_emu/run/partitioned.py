"""A run over several machines (issue 19): the experiment's `machines:`, the first the head.

The head runs the controller (on its loopback) and this orchestrator; Mininet's Cluster Edition
builds each machine's nodes over ssh (fabric_emu.fabric.cluster); each machine runs its share
of the ports and its PFC daemon (fabric_emu.run.machine) and its hosts' NIC engines. What each
machine measures (its switch ports' counters, its PFC daemon's log, its CPU) comes back to the
head, which writes one results folder as a run on one machine does. The phases and the
results are Runner's; what differs is where things run.

Scheduled events act on the machine of each port or NIC they touch (its agent's LINK, RATE and
STORM), controller restarts on the head; captures run on the machine of each port, and their
files come back to the results. Not across machines yet (refused before anything is built:
fabric_emu.run.prepare): background traffic, several jobs, the PFC watchdog and DLB; no live
view or exporter.
"""

from __future__ import annotations

import json
import os
import time
from functools import partial
from pathlib import Path

from fabric_emu.fabric.cluster import ClusterFabric
from fabric_emu.fabric.machines import Machine, MachineAgents, ssh_run
from fabric_emu.fabric.underlay import Underlay, check_underlay, preflight
from fabric_emu.fabric.wires import cut_links
from fabric_emu.fabric.controller import ControllerProcess, start_controller
from fabric_emu.measure import counters
from fabric_emu.measure.fidelity import CpuMonitor, merge_machine_cpu
from fabric_emu.ports.model import port_args
from fabric_emu.ports.pfcd import merge_stats
from fabric_emu.ports.runtime import Charges, settled_charges
from fabric_emu.run.runner import READY_TIMEOUT_S, Interrupted, Runner, keep_logs
from fabric_emu.state.cleanup import clean_record
from fabric_emu.state.records import RunRecord
from fabric_emu.state.supervise import Component, ComponentFailed, Supervisor
from fabric_emu.spec.machines import clock_problem, underlay_bandwidth_problem, underlay_delay_problem
from fabric_emu.topo.placement import Placement, place

SSH_CONFIG_ENV = "FABRIC_EMU_SSH_CONFIG"  # an ssh config file for every ssh to the machines


class PartitionedRunner(Runner):
    """Runner, with the fabric built over the spec's machines."""

    cluster: ClusterFabric | None = None
    ctrl: ControllerProcess | None = None
    underlay: Underlay | None = None  # what the preflight measured

    def conflicts(self) -> list[str]:
        return []  # the fabric's names live on the machines, each in its own Open vSwitch

    def machines(self) -> list[Machine]:
        return [Machine(m.name, m.ssh_address or m.address, m.address, m.ssh_user) for m in self.spec.machines]

    def preflight(self, machines: list[Machine], placement: Placement, ssh_config: Path | None) -> Underlay:
        """Before anything is built: the underlay carries the fabric's frames (MTU), its delay
        divided by the dilation stays within the modelled cable's, and every machine's clock is
        close enough to the head's for one start epoch; the run fails with what is wrong."""
        from fabric_emu.nic.launch import START_DELAY_S

        check_underlay(machines, self.plan.mtu, partial(ssh_run, ssh_config))
        at = placement.machine_of
        pairs = {pair for ln in placement.cut for pair in ((at[ln.a], at[ln.b]), (at[ln.b], at[ln.a]))}
        measured = preflight(ssh_config, machines, pairs)
        problems = [f"machines: {m}: {p}" for m, (offset, unc) in measured.clocks.items()
                    if (p := clock_problem(offset, unc, START_DELAY_S))]
        problems += [f"machines: the underlay from {a} to {b}: {p}" for (a, b), rtt in measured.rtt.items()
                     if (p := underlay_delay_problem(rtt / 2, self.plan.dilation, self.spec.pfc.cable_length))]
        out_of = {m.name: sum(ln.gbps * 1e9 / self.plan.dilation for ln in placement.cut if m.name in (at[ln.a], at[ln.b]))
                  for m in machines}  # every cut link of a machine at its emulated rate, out of it
        problems += [f"machines: the underlay out of {a}: {p}" for (a, _), bps in measured.bandwidth.items()
                     if (p := underlay_bandwidth_problem(out_of[a], bps, self.plan.dilation))]
        if problems:
            raise RuntimeError("; ".join(problems))
        worst = max(measured.rtt.values(), default=0.0)
        skew = max((abs(o) for o, _ in measured.clocks.values()), default=0.0)
        least = min(measured.bandwidth.values(), default=0.0)
        self.say(f"underlay: round trip up to {worst * 1e3:.2f} ms ({worst / 2 / self.plan.dilation * 1e9:.0f} ns "
                 f"modelled one way), at least {least / 1e6:.0f} Mb/s out of each machine, the cut links need up to "
                 f"{max(out_of.values(), default=0.0) / 1e6:.0f}; clocks within {skew * 1e3:.1f} ms of the head's")
        return measured

    def bring_up(self, record: RunRecord, workdir: Path) -> None:
        from fabric_emu.nic.launch import spray_entropies

        t = time.monotonic()
        machines = self.machines()
        placement = place(self.plan, [m.name for m in machines])
        ssh_config = Path(os.environ[SSH_CONFIG_ENV]) if os.environ.get(SSH_CONFIG_ENV) else None
        self.say(f"over {len(machines)} machines: " + "; ".join(
            f"{m.name} {sum(1 for at in placement.machine_of.values() if at == m.name)} nodes" for m in machines)
            + f"; {len(placement.cut)} links cross the underlay")
        self.underlay = self.preflight(machines, placement, ssh_config)
        plan_path = workdir / "plan.json"
        plan_path.write_text(self.plan.to_json())
        self.ctrl = start_controller(plan_path, workdir, lb_mode=self.spec.load_balancing,
                                     spray_entropies=spray_entropies(self.spec, self.plan) or None)
        record.add_process(self.ctrl.pid, "controller")
        self.cluster = ClusterFabric(self.plan, placement, machines, ssh_config, self.ctrl.port, workdir,
                                     record.run_id, ports=port_args(self.spec), record=record,
                                     cut=cut_links(self.spec.events))
        self.cluster.checked = True  # by the preflight
        self.ctrl.wait_listening()
        self.cluster.build()
        self.cluster.start()
        if not self.ctrl.wait_ready(READY_TIMEOUT_S):
            raise RuntimeError(f"the controller did not program all switches within {READY_TIMEOUT_S:.0f}s")
        self.times["bring_up"] = time.monotonic() - t
        self.say(f"fabric up and routed in {self.times['bring_up']:.1f}s")
        self.cluster.check_reachable(self.ranks)
        if self.spec.capture is not None:
            self._start_captures()

    def _capture_machines(self) -> dict[str, list[str]]:
        """The capture's ports, by the machine of their switch."""
        by: dict[str, list[str]] = {}
        owner = {p.intf: sw.name for sw in self.plan.switches for p in self.plan.ports(sw.name)}
        for port in self.spec.capture.ports:
            by.setdefault(self.cluster.placement.machine_of[owner[port]], []).append(port)
        return by

    def _start_captures(self) -> None:
        for machine, ports in self._capture_machines().items():
            spec = self.spec.capture.model_copy(update={"ports": ports})
            self.cluster.agents.ask_one(machine, "CAPTURE_START " + spec.model_dump_json())

    def _fetch_captures(self, run_dir: Path) -> None:
        """Each machine's pcap files, into the results (written aside, then renamed)."""
        for machine in self._capture_machines():
            try:
                files = json.loads(self.cluster.agents.ask_one(machine, "CAPTURE_STOP", expect="["))
            except RuntimeError as e:
                self.say(f"warning: no captures from {machine}: {e}")
                continue
            for path in files:
                data = self.cluster.read_bytes(machine, Path(path))
                if data is not None:
                    tmp = run_dir / f".{Path(path).name}.tmp"
                    tmp.write_bytes(data)
                    tmp.rename(run_dir / Path(path).name)

    def _snapshot(self) -> tuple[list[counters.PortCounters], dict[str, dict[str, int]]]:
        """Every machine's switch port counters (in plan order) and port program counters."""
        answers = self.cluster.agents.ask("SNAPSHOT")
        rows = {(r["switch"], r["port"]): counters.PortCounters(**r) for a in answers.values() for r in a["rows"]}
        order = [(sw.name, p.port) for sw in self.plan.switches for p in self.plan.ports(sw.name)]
        ports = {intf: c for a in answers.values() for intf, c in a["ports"].items()}
        return [rows[k] for k in order], ports

    # -- a scheduled event's part on the machine of each port or NIC it touches --
    def _ends(self, a: str, b: str) -> list[tuple[str, str]]:
        return [(self.cluster.placement.machine_of[p.node], p.intf) for p in self.plan.link_ends(a, b)]

    def _set_link(self, a: str, b: str, up: bool) -> dict:
        """Both ends, as a cut cable; a cut's record gets what the ends' machines gave back of
        their queues (fabric_emu.run.machine, LINK)."""
        given = 0
        for machine, intf in self._ends(a, b):
            answer = self.cluster.agents.ask_one(machine, f"LINK {intf} {'up' if up else 'down'}").split()
            given += int(answer[1]) if len(answer) > 1 else 0
        return {} if up else {"given_back_bytes": given}

    def _set_rate(self, a: str, b: str, gbps: float) -> None:
        for machine, intf in self._ends(a, b):
            self.cluster.agents.ask_one(machine, f"RATE {intf} {gbps:g}")

    def _set_storm(self, host: str, on: bool) -> None:
        self.cluster.agents.ask_one(self.cluster.placement.machine_of[host], f"STORM {host} {'on' if on else 'off'}")

    def traffic_phase(self, record: RunRecord, workdir: Path) -> None:
        from fabric_emu.fabric.events import EventRunner
        from fabric_emu.fabric.keeper import ControllerKeeper
        from fabric_emu.nic.launch import run_agents

        agents_of = self.cluster.agents
        agents_of.ask("COUNTERS")  # every machine answers before traffic
        rows_before, ports_before = self._snapshot()
        t = time.monotonic()
        cut_short: BaseException | None = None
        started = []
        keeper = ControllerKeeper(self.ctrl, record, self.plan.dilation, self.say)
        events = EventRunner(self.spec.events, self.plan.dilation, self.ctrl.rest_url, self._set_link,
                             self._set_rate, self._set_storm, keeper.act)

        def on_go(go: float) -> None:
            started.append(agents_of.ask("CPU_START"))
            keeper.start_watching(go)
            events.start(go)

        self.supervisor = supervisor = Supervisor()  # the NIC engines join it as they start
        for name in agents_of.procs:  # a machine whose agent is gone has lost its ports' PFC daemon
            supervisor.add(Component(f"the machine agent of {name}", "machine", "fail",
                                     probe=lambda name=name: agents_of.ended(name)))
        with CpuMonitor(processes={self.ctrl.pid: "controller"}, ovs=False) as head_cpu:
            keeper.on_new_pid = head_cpu.watch
            try:
                agents = run_agents(self.spec, self.plan, self.ranks, self.cluster, record, workdir, self.say,
                                    info=self.nic_info, site=self.cluster, on_go=on_go, supervisor=supervisor)
            except (Interrupted, ComponentFailed) as e:
                agents, cut_short = getattr(e, "agent_stats", {}), e
            finally:
                fired, outages = events.stop(), keeper.stop()
                lb_state = events.final_state()
        self.times["traffic"] = time.monotonic() - t
        ended_monotonic = time.monotonic()
        if isinstance(cut_short, ComponentFailed):  # a part died: a machine may be gone, so none is asked
            self.traffic = {"status": "failed", "agents": agents, "traffic_start": t,
                            "ended_monotonic": ended_monotonic, "events": fired, "controller_outages": outages}
            raise cut_short
        machine_cpu = agents_of.ask("CPU_STOP") if started else {}
        rows_after, ports_after = self._snapshot()
        charges = settled_charges(partial(self._charges, agents_of)) if self.spec.pfc.enabled else None
        ports = counters.delta(rows_after, rows_before)
        ttl = (lb_state or {}).get("ttl_expired", {})
        for row in ports:
            row.ttl_expired = int(ttl.get(row.switch, {}).get(str(row.port), 0))
        ok = agents and all(a.get("status") == "ok" for a in agents.values())
        self.traffic = {
            "status": "ok" if ok and not cut_short else "incomplete", "agents": agents,
            "machines": self._machines_section(machine_cpu),
            "ports": ports, "queues": [], "events": fired, "lb": lb_state, "controller_outages": outages,
            "cpu": merge_machine_cpu({"head": head_cpu.summary(), **machine_cpu}),
            "traffic_start": t, "thresholds": [r for rows in agents_of.ask("THRESHOLDS").values() for r in rows],
            "nics": counters.nic_totals(self.plan, ports_before, ports_after), "ended_monotonic": ended_monotonic,
            "charges": charges,
        }
        if cut_short is not None:
            raise cut_short

    @staticmethod
    def _charges(agents_of: MachineAgents) -> Charges:
        """Every machine's lossless accounting as one: each credits a frame as it leaves for
        another machine, so a port's bytes are all on its own machine."""
        held: dict[str, int] = {}
        pairs: dict[tuple[str, str], int] = {}
        for part in agents_of.ask("CHARGES").values():
            held.update(part["held"])
            pairs.update({(a, b): n for a, b, n in part["pairs"]})
        return held, pairs

    def _machines_section(self, cpu: dict[str, dict]) -> dict:
        """summary.json's `machines`: where everything ran, the links between machines, and each
        machine's CPU while the traffic ran."""
        at = self.cluster.placement.machine_of
        return {"head": self.spec.machines[0].name, "underlay_mtu_needed": self.plan.extra["placement"]["underlay_mtu"],
                **(self.underlay.to_dict() if self.underlay is not None else {}),
                "cut_links": [f"{ln.a}-{ln.b}" for ln in self.cluster.placement.cut],
                "by_machine": {m.name: {"address": m.address,
                                        "switches": [s.name for s in self.plan.switches if at[s.name] == m.name],
                                        "hosts": [h.name for h in self.plan.hosts if at[h.name] == m.name],
                                        "cpu_busy_mean": cpu.get(m.name, {}).get("cpu_busy_mean"),
                                        "cpu_busy_max": cpu.get(m.name, {}).get("cpu_busy_max")}
                               for m in self.spec.machines}}

    def _fetch_logs(self, workdir: Path) -> None:
        """Each machine's PFC daemon log, beside the head's logs (keep_logs copies them)."""
        for m in self.spec.machines:
            try:
                text = self.cluster.read(m.name, self.cluster.machine_workdir(m.name) / "pfcd.log")
            except Exception:  # noqa: BLE001 - a log never fails the run
                text = None
            if text:
                (workdir / f"pfcd-{m.name}.log").write_text(text)

    def _tear_down(self, record: RunRecord, workdir: Path, run_dir: Path) -> None:
        t = time.monotonic()
        try:
            if self.cluster is not None and self.cluster.agents is not None:
                if self.spec.capture is not None:
                    self._fetch_captures(run_dir)
                self._fetch_logs(workdir)
            if self.cluster is not None:
                stats = self.cluster.stop()
                if stats:
                    self.traffic["pfc_daemon"] = merge_stats(list(stats.values()))
        except Exception as e:  # noqa: BLE001 - the record-based clean still runs
            self.say(f"tearing the machines' shares down failed ({e}); cleaning from the run record")
        if self.ctrl is not None:
            self.ctrl.stop()
        keep_logs(workdir, run_dir)
        clean_record(record)
        self.times["tear_down"] = time.monotonic() - t
