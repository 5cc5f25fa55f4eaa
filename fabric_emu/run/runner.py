"""One experiment run: spec -> plan -> fabric -> traffic -> counters -> results.

Owns the lifecycle: a lock so only one fabric exists at a time, a RunRecord so anything created
can be removed even after kill -9, teardown on success, failure or Ctrl-C, and a results folder
whose files are each written atomically.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path

from typing import TYPE_CHECKING

from rich.console import Console

from fabric_emu.measure import counters
from fabric_emu.measure.deadlocks import DeadlockSampler
from fabric_emu.results import folder as results
from fabric_emu.workloads.flows import planned_bytes, workload_line_rate_s
from fabric_emu.run.background import Background
from fabric_emu.fabric.capture import Captures
from fabric_emu.state.cleanup import clean_record, clean_stale
from fabric_emu.spec.experiment import ExperimentSpec
from fabric_emu.spec.load import resolved_dict
from fabric_emu.measure.fidelity import CpuMonitor
from fabric_emu.measure.thread_cpu import pfc_processes
from fabric_emu.kernel.ovs_datapath import datapath_fields, datapath_of
from fabric_emu.live.manifest import LiveManifest
from fabric_emu.live.publish import RunPublisher, live_ports, manifest_path
from fabric_emu.topo.plan import FabricPlan
from fabric_emu.run.progress import OnProgress, ProgressEvent, RunProgress
from fabric_emu.state.records import RunLock, RunRecord
from fabric_emu.state.supervise import ComponentFailed, Supervisor
from fabric_emu.run.supervise import ensure_ovs, ovs_back_after_death, run_supervisor
from fabric_emu.results.pfcwd import pfcwd_rows
from fabric_emu.results.switch import pause_rows
from fabric_emu.results.summary import build_summary
from fabric_emu.results.table import print_summary
from fabric_emu.results.transport import flow_rows, rate_rows

if TYPE_CHECKING:
    from fabric_emu.fabric.routed import RoutedFabric

READY_TIMEOUT_S = 60.0


class Interrupted(Exception):
    """Ctrl-C or SIGTERM during a run."""


def _raise_interrupted(signum, frame):  # noqa: ARG001 - signal handler signature
    raise Interrupted(signal.Signals(signum).name)


class Runner:
    def __init__(self, spec: ExperimentSpec, plan: FabricPlan, ranks: list[str], out_base: Path,
                 command: list[str], console: Console, metrics_port: int | None = 0,
                 metrics_linger_s: float = 0.0, on_progress: OnProgress | None = None) -> None:
        self.spec = spec
        self.plan = plan
        self.ranks = ranks
        self.out_base = out_base
        self.command = command
        self.console = console
        self.err = Console(stderr=True, soft_wrap=True, highlight=False, quiet=console.quiet)
        self.times: dict[str, float] = {}
        self.routed: RoutedFabric | None = None  # set before anything starts: teardown finds it
        self.traffic: dict = {}  # what the traffic phase measured, even if it was cut short
        self.captures: Captures | None = None
        self.nic_info: dict = {}  # the NIC engines: how many, ready after, memory
        self.metrics_port = metrics_port  # the exporter's port (0: a free one; None: no exporter)
        self.metrics_linger_s = metrics_linger_s  # serve the final metrics this long after the run
        self.live: RunPublisher | None = None  # the live manifest and exporter (fabric_emu.live)
        self.on_progress = on_progress  # told each phase, and the traffic's progress (fabric_emu.api)
        self.run_dir: Path | None = None  # the results folder, once made
        self.error: str | None = None  # why the run failed, if it did
        self.supervisor: Supervisor | None = None  # the run's parts, watched while traffic flows
        self._started = time.monotonic()

    def _phase(self, phase: str, text: str = "", fraction: float | None = None) -> None:
        if self.on_progress is not None:
            self.on_progress(ProgressEvent(phase, fraction, time.monotonic() - self._started, text))

    def _refuse(self, msg: str) -> int:
        """A run that cannot start: said on stderr, kept for the API, exit code 1."""
        self.error = msg
        self.err.print(f"error: {msg}", style="red")
        return 1

    def say(self, msg: str) -> None:
        self.console.print(f"[dim]{time.strftime('%H:%M:%S')}[/] {msg}", highlight=False, soft_wrap=True)

    # ------------------------------------------------------------------ lifecycle
    def run(self, debug: bool = False) -> int:
        lock = RunLock()
        if not lock.acquire():
            return self._refuse("another fabric-emu run is in progress on this machine")
        try:
            try:  # clean_stale and the build need it; a run that killed it left it down
                ensure_ovs(self.say)
            except RuntimeError as e:
                return self._refuse(str(e))
            removed, _ = clean_stale()
            if removed:
                self.say(f"removed {len(removed)} leftovers of an earlier run that did not finish")
            taken = self.conflicts()
            if taken:
                return self._refuse(f"names the fabric needs are already in use and are not "
                                    f"fabric-emu's: {', '.join(taken[:8])}")
            return self._run_locked(debug)
        finally:
            if self.live is not None:
                if self.live.server is not None and self.metrics_linger_s and self.live.manifest.final is not None:
                    self.say(f"metrics: serving the final values {self.metrics_linger_s:g} s more")
                self.live.close(self.metrics_linger_s)
            lock.release()

    def conflicts(self) -> list[str]:
        """Names the fabric needs that something else on this machine already uses."""
        from fabric_emu.fabric.build import conflicts

        return conflicts(self.plan)

    def open_results(self, started: float) -> Path:
        """The run's results folder, with its spec and a summary saying it is not finished."""
        run_dir = results.make_run_dir(self.out_base, self.spec.name, started)
        results.write_yaml(run_dir / "experiment.yaml", resolved_dict(self.spec))
        # Replaced at the end; if this process is killed, the folder still says what happened.
        results.write_json(run_dir / "summary.json", {
            "status": "incomplete", "experiment": self.spec.name,
            "load_balancing": self.spec.load_balancing,
            "error": "the run did not finish (still running, or killed)"})
        return run_dir

    def _run_locked(self, debug: bool) -> int:
        started = time.time()
        run_dir = self.run_dir = self.open_results(started)
        record = RunRecord.new(f"{results.utc_stamp(started)}-{os.getpid()}")
        workdir = record.new_workdir()
        self.say(f"run {record.run_id}: {self.plan.name}, {len(self.plan.switches)} switches, "
                 f"{len(self.plan.hosts)} hosts; results in {run_dir}")

        state = {"status": "failed", "error": None}
        old_int = signal.signal(signal.SIGINT, _raise_interrupted)
        old_term = signal.signal(signal.SIGTERM, _raise_interrupted)
        try:
            self._phase("bring_up", f"building {self.plan.name}")
            self.bring_up(record, workdir)
            self._phase("traffic", "starting")
            self.traffic_phase(record, workdir)
            state["status"] = self.traffic["status"]
        except Interrupted as e:
            state.update(status="incomplete", error=f"interrupted ({e})")
        except ComponentFailed as e:  # a part of the run died: what was measured is kept
            state.update(status="failed", error=str(e), fault=e.kind)
        except Exception as e:  # noqa: BLE001 - every failure still tears down and reports
            state.update(status="failed", error=f"{type(e).__name__}: {e}")
            if debug:
                import traceback
                traceback.print_exc()
        finally:
            # Teardown must finish even if the user presses Ctrl-C again.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            self._phase("tear_down", "tearing the fabric down")
            self._tear_down(record, workdir, run_dir)
            signal.signal(signal.SIGINT, old_int)
            signal.signal(signal.SIGTERM, old_term)

        if self.routed is not None and self.routed.pfc_stats:
            self.traffic["pfc_daemon"] = self.routed.pfc_stats
        if self.supervisor is not None and self.supervisor.restarts:
            self.traffic["restarts"] = self.supervisor.restarts
        self._phase("results", str(run_dir))
        code = self.write_results(run_dir, state, started, record.run_id)
        self._phase("done", state["status"])
        return code

    def write_results(self, run_dir: Path, state: dict, started: float, run_id: str) -> int:
        """summary.json, metadata.json and the CSVs of the traffic phase (self.traffic), the
        summary table and the plots; returns the exit code (0: the run is ok)."""
        ended = time.time()
        traffic = self.traffic
        if "traffic_start" in traffic:  # the PFC daemon's log is on the monotonic clock, from GO
            traffic["go_monotonic"] = go = self._go_monotonic(traffic)
            traffic["traffic_fabric_s"] = (traffic["ended_monotonic"] - go) / self.plan.dilation
        traffic["deadlocks"] = deadlocks = self._deadlocks(traffic)
        summary = build_summary(self.spec, self.plan, self.ranks, traffic, state)
        results.write_json(run_dir / "summary.json", summary)
        results.write_json(run_dir / "metadata.json", {
            **results.environment(),
            "command": self.command, "seed": self.spec.seed, "run_id": run_id,
            "start": results.iso(started), "end": results.iso(ended),
            "phases_s": {k: round(v, 3) for k, v in self.times.items()},
            "nic_engines": self.nic_info,
            "dilation": self.plan.dilation, **datapath_fields(self.plan.extra),
            "status": summary["status"], "error": summary.get("error"),
        })
        if traffic.get("ports"):
            results.write_csv(run_dir / "ports.csv", [p.row(self.plan.dilation) for p in traffic["ports"]])
        if traffic.get("agents"):
            results.write_csv(run_dir / "flows.csv", flow_rows(self.plan, traffic["agents"]))
            if rates := rate_rows(traffic["agents"], self.plan.dilation):
                results.write_csv(run_dir / "rates.csv", rates)
        if traffic.get("queues"):
            results.write_csv(run_dir / "queues.csv", traffic["queues"])
        if traffic.get("thresholds"):
            results.write_csv(run_dir / "thresholds.csv", traffic["thresholds"])
        if "traffic_start" in traffic and traffic.get("pfc_daemon"):
            results.write_csv(run_dir / "pauses.csv", pause_rows(self.plan, traffic["pfc_daemon"],
                                                                 self._go_monotonic(traffic)))
        if (traffic.get("pfc_daemon") or {}).get("watchdog"):
            results.write_csv(run_dir / "pfcwd.csv", pfcwd_rows(traffic["pfc_daemon"]))
        if deadlocks is not None and deadlocks.episodes:
            results.write_csv(run_dir / "deadlocks.csv", deadlocks.rows())
        print_summary(self.console, summary, run_dir)
        try:  # after every CSV; a plot never fails the run
            from fabric_emu.results.plots import write_plots
            if plots := write_plots(run_dir):
                self.console.print(f"plots: {run_dir}/plots/ ({', '.join(p.name for p in plots)})",
                                   soft_wrap=True, highlight=False)
        except Exception as e:  # noqa: BLE001
            self.say(f"warning: no plots: {type(e).__name__}: {e}")
        self.error = summary.get("error") or (None if summary["status"] == "ok" else f"the run is {summary['status']}")
        if summary.get("error"):
            self.err.print(f"error: {summary['error']}", style="red")
        return 0 if summary["status"] == "ok" else 1

    def _deadlocks(self, traffic: dict):
        """The PFC deadlock detector over the run's samples (with PFC on): a cycle persisted
        once it held for the watchdog's detection time (the classroom preset's when the
        watchdog is off)."""
        if not self.spec.pfc.enabled or "go_monotonic" not in traffic or not traffic.get("waits"):
            return None
        from fabric_emu.measure.deadlocks import track

        return track(traffic["waits"], traffic["go_monotonic"], self.plan.dilation,
                     self.spec.pfcwd.detection_time, [s.name for s in self.plan.switches])

    @staticmethod
    def _go_monotonic(traffic: dict) -> float:
        """When the agents started (their GO), on the monotonic clock the PFC daemon logs with,
        so pause times line up with the flows' times; the traffic phase's start without it."""
        gos = [a["go"] for a in (traffic.get("agents") or {}).values() if a.get("go")]
        if not gos:
            return traffic["traffic_start"]
        return min(gos) - (time.time() - time.monotonic())

    def bring_up(self, record: RunRecord, workdir: Path, every_link_cuttable: bool = False):
        """Build, route and publish the fabric (the lab keeps it up between runs). Links the
        spec's events cut get a wire (fabric_emu.fabric.wires); every_link_cuttable: every link
        between two switches does (a lab, whose user may cut any)."""
        from fabric_emu.ports.model import port_args, port_plan_from_args
        from fabric_emu.fabric.routed import RoutedFabric
        from fabric_emu.fabric.wires import cut_links, switch_links
        from fabric_emu.nic.launch import spray_entropies

        t = time.monotonic()
        ports = port_plan_from_args(self.plan, port_args(self.spec))
        d = self.plan.dilation
        dlb = (round(self.spec.dlb.inactivity * d * 1e9), round(self.spec.dlb.quality_window * d * 1e9))
        self.routed = RoutedFabric(self.plan, record, workdir, self.spec.load_balancing, ports=ports,
                                   spray_entropies=spray_entropies(self.spec, self.plan) or None, dlb=dlb,
                                   wired=switch_links(self.plan) if every_link_cuttable else cut_links(self.spec.events))
        self.routed.up(READY_TIMEOUT_S)
        self.times["bring_up"] = time.monotonic() - t
        self.say(f"fabric up and routed in {self.times['bring_up']:.1f}s")
        self.routed.fabric.check_reachable(self.ranks)
        self._publish_live(record, workdir)
        if self.spec.capture is not None:
            self.captures = Captures(self.spec.capture, workdir, record)
            self.captures.start()

    def _publish_live(self, record: RunRecord, workdir: Path) -> None:
        """The live manifest for `fabric-emu top`, and the Prometheus exporter (run record names both)."""
        self.live = RunPublisher(record, LiveManifest(
            run_id=record.run_id, experiment=self.spec.name, dilation=self.plan.dilation,
            load_balancing=self.spec.load_balancing, congestion_control=self.spec.congestion_control,
            workdir=str(workdir), pins=str(self.routed.ports.pins), controller_url=record.controller_url,
            ports=live_ports(self.plan, self.routed.port_plan.ends), path=manifest_path(workdir)),
            self.metrics_port)
        self.live.start()
        if self.live.server is not None:
            self.say(f"metrics: {self.live.server.url}")

    def _on_go(self, events, go: float) -> None:
        events.start(go)
        self.live.go(go)

    def traffic_phase(self, record: RunRecord, workdir: Path) -> None:
        """Run the workload on the fabric that is up (self.routed, self.live); what it measured
        goes to self.traffic, even when cut short (then Interrupted is raised again)."""
        from fabric_emu.fabric.events import EventRunner
        from fabric_emu.nic.launch import run_agents

        self.supervisor = supervisor = run_supervisor(self.routed, self.live)
        alone = self._jobs_alone(record, workdir) if len(self.spec.workloads) > 1 and self.spec.jobs_alone else {}
        lossless = self.routed.ports
        lossless.reset_high_water()  # this run's deepest queues only, also in a lab's later runs
        port_before = lossless.counters()
        before = counters.snapshot(self.plan, port_before)
        self.live.traffic_started(before)
        t = time.monotonic()
        cut_short: BaseException | None = None
        keeper = self._controller_keeper(record)
        events = EventRunner(self.spec.events, self.plan.dilation, self.routed.ctrl.rest_url,
                             self.routed.set_link, self.routed.fabric.set_link_rate, lossless.set_storm,
                             keeper.act)
        background = Background(self.spec.background, self.routed.fabric, self.plan, record)
        background.prepare()
        progress = self._progress(lossless.to_hosts)

        def on_go(go: float) -> None:  # events, background traffic and the progress bar count from GO
            lossless.traffic_starts(go)
            keeper.start_watching(go)
            self._on_go(events, go)
            background.start(go)
            progress.start(go)

        with CpuMonitor(processes=self._watched(), datapath=datapath_of(self.plan.extra)) as cpu, counters.QueueSampler(
                self.plan, lossless.backlogs_now, lossless.paused_now) as queues, progress, DeadlockSampler(
                lossless.waits_now) as waits:
            keeper.on_new_pid = supervisor.on_new_pid = cpu.watch
            try:  # the NIC engines register with cpu.watch as they start
                agents = run_agents(self.spec, self.plan, self.ranks, self.routed.fabric, record,
                                    workdir, self.say, watch=cpu.watch, info=self.nic_info,
                                    on_go=on_go, supervisor=supervisor)
            except (Interrupted, ComponentFailed) as e:
                agents, cut_short = getattr(e, "agent_stats", {}), e
            finally:
                fired = events.stop()
                outages = keeper.stop()
                lossless.end_storms()
                flows_behind = background.stop()
                lb_state = events.final_state()
        self.times["traffic"] = time.monotonic() - t
        ended_monotonic = time.monotonic()
        port_after = lossless.counters()
        charges = lossless.settled_charges() if self.spec.pfc.enabled and lossless.maps is not None else None
        # OVS died: its OpenFlow counters (and traces) went with it; the rest is still measured.
        ovs_gone = isinstance(cut_short, ComponentFailed) and cut_short.kind == "ovs"
        ports = [] if ovs_gone else counters.delta(counters.snapshot(self.plan, port_after), before)
        nics = counters.nic_totals(self.plan, port_before, port_after)
        self.live.traffic_ended([p.row(self.plan.dilation) for p in ports],
                                lossless.maps.table if lossless.maps is not None else None)
        ttl = (lb_state or {}).get("ttl_expired", {})
        for row in ports:
            row.max_backlog_bytes = queues.max_backlog.get(row.intf, 0)
            row.ttl_expired = int(ttl.get(row.switch, {}).get(str(row.port), 0))
        queues.shift(self._go_monotonic({"agents": agents, "traffic_start": queues.start}))
        ok = agents and all(a.get("status") == "ok" for a in agents.values())
        if self.spec.load_balancing == "ecmp" and not ovs_gone:  # spraying QPs take every uplink, no one path
            self.routed.fabric.annotate_uplinks(agents)
        self.traffic = {"status": "ok" if ok and not cut_short else "incomplete", "agents": agents,
                        "ports": ports, "queues": queues.rows, "cpu": cpu.summary(),
                        "traffic_start": t, "thresholds": lossless.installed(), "nics": nics,
                        "events": fired, "lb": lb_state, "alone": alone, "background": flows_behind,
                        "ended_monotonic": ended_monotonic, "waits": waits.samples,
                        "controller_outages": outages, "charges": charges}
        if cut_short is not None:
            raise cut_short

    def _controller_keeper(self, record: RunRecord):
        """Restarts the controller on `controller:` events, and whenever it dies on its own
        during the traffic phase (fabric_emu.fabric.keeper)."""
        from fabric_emu.fabric.keeper import ControllerKeeper

        return ControllerKeeper(self.routed.ctrl, record, self.plan.dilation, self.say)

    def _jobs_alone(self, record: RunRecord, workdir: Path) -> dict[str, float]:
        """Each job run by itself before they run together (with the background traffic, if
        any, which is part of the fabric's life): job name -> its completion time (modelled
        seconds), the yardstick of how much the other jobs slowed it."""
        from fabric_emu.workloads import jobs
        from fabric_emu.nic.launch import run_agents

        out: dict[str, float] = {}
        for job in jobs.resolve_jobs(self.spec, self.plan):
            spec = self.spec.model_copy(update={
                "workloads": [job.workload.model_copy(update={"name": job.name})], "events": []})
            program = jobs.build_program(jobs.resolve_jobs(spec, self.plan))
            # the job's NICs, and PXN's relays (GPUs of its servers that forward its messages)
            ranks = [h.name for h in self.plan.hosts if h.name in set(program.hosts)]
            sub = workdir / f"alone-{job.name}"
            sub.mkdir()
            self.say(f"job {job.name} alone first")
            background = Background(self.spec.background, self.routed.fabric, self.plan, record)
            background.prepare()
            try:
                stats = run_agents(spec, self.plan, ranks, self.routed.fabric, record, sub, self.say,
                                   on_go=background.start, supervisor=self.supervisor)
            finally:
                background.stop()
            times = jobs.op_times(program, {h: a.get("ops") or [] for h, a in stats.items()})
            bounds = jobs.step_bounds(program, times, job.name)
            if bounds is not None:
                out[job.name] = (bounds[-1][1] - bounds[0][0]) / self.plan.dilation
        return out

    def _progress(self, to_hosts: Callable[[], tuple[int, int]]) -> RunProgress:
        """The bar of a long run on a terminal (a no-op otherwise)."""
        from fabric_emu.workloads import jobs

        rate = self.plan.host_rate_bps(self.ranks[0])
        if jobs.uses_program(self.spec):
            program = jobs.build_program(jobs.resolve_jobs(self.spec, self.plan))
            line_rate_s = jobs.line_rate_s(program, rate, self.plan.dilation)
            planned = jobs.fabric_bytes(program)  # what the NICs' receive QPs will count
        else:
            hosts = [h.name for h in self.plan.hosts]
            line_rate_s = workload_line_rate_s(self.spec.workload, self.ranks, hosts, rate, self.plan.dilation)
            planned = planned_bytes(self.spec.workload, self.ranks, hosts)
        return RunProgress(self.console, to_hosts, planned, line_rate_s, self.plan.dilation,
                           on_update=None if self.on_progress is None else
                           lambda fraction, text: self._phase("traffic", text, fraction))

    def _watched(self) -> dict[int, str]:
        """The fabric's own processes whose threads the CPU monitor samples (ovs-vswitchd it
        finds itself; the NIC engines register as they start)."""
        procs = {}
        if self.routed.ctrl is not None:
            procs[self.routed.ctrl.pid] = "controller"
        daemon = getattr(self.routed.ports, "daemon", None)
        procs.update(pfc_processes(daemon.pid if daemon is not None else None))
        return procs

    def _tear_down(self, record: RunRecord, workdir: Path, run_dir: Path) -> None:
        t = time.monotonic()
        if self.captures is not None:
            self.captures.stop(run_dir)
        if self.routed is not None:
            ovs_back_after_death(self.say)  # else tearing its bridges down would hang
            for problem in self.routed.down():
                self.say(f"{problem}; cleaning from the run record")
        keep_logs(workdir, run_dir)
        clean_record(record)
        self.times["tear_down"] = time.monotonic() - t


def keep_logs(workdir: Path, run_dir: Path) -> None:
    """Copy the processes' logs and each agent's own measurements into the results folder."""
    logs = run_dir / "logs"
    logs.mkdir(exist_ok=True)
    for f in workdir.glob("*.log"):
        shutil.copy2(f, logs / f.name)
    agents = run_dir / "agents"  # each agent's own measurements, for whoever digs deeper
    for f in workdir.glob("agent-*.json"):
        if not f.name.endswith(".config.json"):
            agents.mkdir(exist_ok=True)
            shutil.copy2(f, agents / f.name.removeprefix("agent-"))
