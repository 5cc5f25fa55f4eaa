"""A lab session: one fabric kept up while the student runs workloads and turns knobs.

Built from the runner's pieces: Runner.bring_up (RoutedFabric, the live manifest and the
Prometheus exporter, all named in the run record), Runner.traffic_phase and write_results for
every `run` (a results folder each, as `fabric-emu run` writes it), and the record-based clean
at the end, whatever ends the lab. Knobs are `--set` overrides of the lab's experiment
(fabric_emu.lab.commands); the spec they make is validated before anything changes.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from rich.console import Console

from fabric_emu.results import folder as results
from fabric_emu.lb import spray
from fabric_emu.state.cleanup import clean_record, clean_stale
from fabric_emu.spec.errors import SpecError
from fabric_emu.spec.experiment import ExperimentSpec
from fabric_emu.lab.commands import LabInputError, LbRequest, LinkRequest, workload_overrides
from fabric_emu.topo.plan import FabricPlan
from fabric_emu.state.records import RunLock, RunRecord
from fabric_emu.run.runner import Interrupted, Runner, _raise_interrupted, keep_logs

DLB_READY_TIMEOUT_S = 20.0


class LabExit(Interrupted):
    """SIGTERM or SIGHUP (the terminal went away): leave the lab, tearing everything down."""


def _raise_lab_exit(signum, frame):  # noqa: ARG001 - signal handler signature
    raise LabExit(signal.Signals(signum).name)


@dataclass
class LabRun:
    number: int
    label: str | None
    run_dir: Path
    summary: dict
    command: str


@contextmanager
def no_interrupts() -> Iterator[None]:
    """Ctrl-C and termination wait while the fabric changes state or files are written."""
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


class LabSession:
    def __init__(self, experiment: Path, sets: list[str], out_base: Path, console: Console,
                 metrics_port: int | None = 0) -> None:
        from fabric_emu.run.prepare import load_checked

        self.experiment = experiment
        self.base_sets = list(sets)
        self.out_base = out_base
        self.console = console
        self.metrics_port = metrics_port
        self.overrides: dict[str, str] = {}  # the knobs turned so far: dotted key -> YAML text
        spec, plan, _ = load_checked(experiment, self.base_sets, measure=True)
        if spec.topology.dilation == "auto":  # never re-chosen mid-lab: the fabric is built
            self.base_sets.append(f"topology.dilation={plan.dilation}")
        # Nor the datapath: the bridges are built on the one chosen now.
        self.base_sets.append(f"datapath={plan.extra['datapath']['datapath']}")
        self.spec: ExperimentSpec = spec
        self.plan: FabricPlan = plan
        self.runs: list[LabRun] = []
        self.lock = RunLock()
        self.record: RunRecord | None = None
        self.workdir: Path | None = None
        self.runner: Runner | None = None  # the bring-up's: owns routed and live
        self.links_down: set[frozenset[str]] = set()

    # ------------------------------------------------------------------ spec
    def load(self, extra: dict[str, str] | None = None) -> tuple[ExperimentSpec, FabricPlan, list[str]]:
        """The experiment with the knobs (and extra) applied; SpecError if it is not valid."""
        from fabric_emu.run.prepare import load_checked

        merged = {**self.overrides, **(extra or {})}
        return load_checked(self.experiment, self.base_sets + [f"{k}={v}" for k, v in merged.items()])

    def turn(self, overrides: dict[str, str]) -> ExperimentSpec:
        """Validate and keep knob overrides; the spec they make (nothing changed on error)."""
        spec, _, _ = self.load(overrides)
        self.overrides.update(overrides)
        self.spec = spec
        return spec

    def say(self, msg: str) -> None:
        self.console.print(f"[dim]{time.strftime('%H:%M:%S')}[/] {msg}", highlight=False, soft_wrap=True)

    # ------------------------------------------------------------------ lifecycle
    def up(self) -> None:
        """Build the fabric, route it and publish it; raises RuntimeError if it cannot."""
        if not self.lock.acquire():
            raise RuntimeError("another fabric-emu run or lab is in progress on this machine")
        removed, _ = clean_stale()
        if removed:
            self.say(f"removed {len(removed)} leftovers of an earlier run that did not finish")
        from fabric_emu.fabric.build import conflicts

        taken = conflicts(self.plan)
        if taken:
            raise RuntimeError(f"names the fabric needs are already in use and are not fabric-emu's: "
                               f"{', '.join(taken[:8])}")
        started = time.time()
        self.record = RunRecord.new(f"{results.utc_stamp(started)}-{os.getpid()}")
        self.workdir = self.record.new_workdir("fabric-emu-lab-")
        self.say(f"lab {self.record.run_id}: {self.plan.name}, {len(self.plan.switches)} switches, "
                 f"{len(self.plan.hosts)} hosts; building it")
        self.runner = Runner(self._boot_spec(), self.plan, [h.name for h in self.plan.hosts], self.out_base,
                             command=[], console=self.console, metrics_port=self.metrics_port)
        self.runner.bring_up(self.record, self.workdir, every_link_cuttable=True)  # `link a-b down` may cut any
        if not self.spec.pfc.enabled:  # built with PFC-sized lossless FIFOs; now as the spec says
            self._apply_ports(self.spec)

    def _boot_spec(self) -> ExperimentSpec:
        """What the fabric is built with: the experiment, plus what a knob may need later without
        a rebuild: spraying's entropies at the controller, PFC-sized lossless FIFOs; no capture."""
        entropies = spray.plan_entropies([len(self.plan.uplinks(leaf.name)) for leaf in self.plan.leaves],
                                         self.spec.spray.entropies)
        return self.spec.model_copy(update={
            "spray": self.spec.spray.model_copy(update={"entropies": entropies}),
            "pfc": self.spec.pfc.model_copy(update={"enabled": True}), "capture": None})

    @property
    def routed(self):
        return self.runner.routed if self.runner is not None else None

    def down(self) -> list[str]:
        """Tear everything down (the run record's clean last); returns the problems met."""
        problems: list[str] = []
        with no_interrupts():
            if self.runner is not None and self.routed is not None:
                problems += self.routed.down()
            if self.runner is not None and self.runner.live is not None:
                self.runner.live.close()
            if self.record is not None:
                clean_record(self.record)
                self.record = None
            self.lock.release()
        return problems

    # ------------------------------------------------------------------ knobs
    def set_lb(self, req: LbRequest) -> dict:
        """Change the load balancing live (the controller), and for the next runs' NICs."""
        from fabric_emu.fabric.events import RestError, rest_call

        self.load({"load_balancing": req.mode})  # validate first
        try:
            change = rest_call(self.record.controller_url, {"mode": req.mode, "params": req.params})
        except RestError as e:
            raise LabInputError(f"lb: {e}") from None
        self.turn({"load_balancing": req.mode})
        if req.mode == "dlb":
            self._wait_dlb()
        return change

    def _wait_dlb(self) -> None:
        from fabric_emu.fabric.events import RestError, rest_call

        deadline = time.monotonic() + DLB_READY_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                if rest_call(self.record.controller_url, timeout=2.0).get("dlb", {}).get("ready"):
                    return
            except RestError:
                pass
            time.sleep(0.1)
        raise RuntimeError("the controller did not set the DLB stage up")

    def lb_state(self) -> dict:
        from fabric_emu.fabric.events import rest_call

        return rest_call(self.record.controller_url)

    def set_ports(self, overrides: dict[str, str]) -> ExperimentSpec:
        """ECN or PFC knobs: validated, then written to every switch port now (BPF map; the
        PFC daemon is restarted with its new ports)."""
        spec = self.turn(overrides)
        with no_interrupts():
            self._apply_ports(spec)
        return spec

    def set_watchdog(self, overrides: dict[str, str]) -> ExperimentSpec:
        """pfcwd knobs: validated, then the PFC daemon restarted with the new watchdog."""
        from fabric_emu.ports.model import watchdog_timers

        spec = self.turn(overrides)
        with no_interrupts():
            self.routed.ports.set_watchdog(watchdog_timers(spec), spec.pfcwd.ports, spec.seed)
        return spec

    def _apply_ports(self, spec: ExperimentSpec) -> None:
        from fabric_emu.ports.model import settings_of, switch_settings

        self.routed.ports.reconfigure(switch_settings(self.plan, *settings_of(spec)))

    def set_link(self, req: LinkRequest) -> None:
        self.routed.set_link(req.a, req.b, req.up)
        (self.links_down.discard if req.up else self.links_down.add)(frozenset((req.a, req.b)))

    # ------------------------------------------------------------------ runs
    def run(self, workload: dict | None, label: str | None, line: str) -> LabRun:
        """One traffic phase on the fabric that is up, and its results folder. Ctrl-C cuts the
        run short (its folder says so); SIGTERM/SIGHUP do too, then leave the lab (LabExit)."""
        extra = workload_overrides(workload) if workload is not None else {}
        spec, plan, ranks = self.load(extra)  # SpecError: nothing ran
        self._clear_nic_files()
        runner = Runner(spec, self.plan, ranks, self.out_base, command=["fabric-emu", "lab", str(self.experiment),
                        "--", line], console=self.console, metrics_port=None)
        runner.routed, runner.live = self.routed, self.runner.live
        started = time.time()
        run_dir = runner.open_results(started)
        state: dict = {"status": "failed", "error": None}
        cut: Interrupted | None = None
        old_int = signal.signal(signal.SIGINT, _raise_interrupted)
        try:
            runner.traffic_phase(self.record, self.workdir)
            state["status"] = runner.traffic["status"]
        except Interrupted as e:
            state.update(status="incomplete", error=f"interrupted ({e})")
            cut = e
        except Exception as e:  # noqa: BLE001 - a failed run is reported; the lab goes on
            state.update(status="failed", error=f"{type(e).__name__}: {e}")
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            with no_interrupts():
                runner.traffic["pfc_daemon"] = self.routed.ports.restart_daemon()  # this run's pauses
                keep_logs(self.workdir, run_dir)
                runner.write_results(run_dir, state, started, self.record.run_id)
        finally:
            signal.signal(signal.SIGINT, old_int)
        summary = results_summary(run_dir)
        lab_run = LabRun(len(self.runs) + 1, label, run_dir, summary, line)
        self.runs.append(lab_run)
        if isinstance(cut, LabExit):
            raise cut
        return lab_run

    def _clear_nic_files(self) -> None:
        """The previous run's NIC files: a NIC that fails must not leave its older stats to be read."""
        for pattern in ("agent-*.json", "engine*.json", "engine*.live.json"):
            for f in self.workdir.glob(pattern):
                f.unlink(missing_ok=True)

    def named_runs(self) -> dict[str, dict]:
        """Summaries by name for expect: `as` labels, run1.., and last."""
        out = {f"run{r.number}": r.summary for r in self.runs}
        out.update({r.label: r.summary for r in self.runs if r.label})
        if self.runs:
            out["last"] = self.runs[-1].summary
        return out

    def save(self, name: str, transcript: list[str]) -> Path:
        """Copy this session's runs into OUT/lab/NAME/ (run folders and the commands typed)."""
        dest = self.out_base / "lab" / name
        if dest.exists():
            raise LabInputError(f"save: {dest} exists already; pick another name")
        dest.mkdir(parents=True)
        for r in self.runs:
            shutil.copytree(r.run_dir, dest / f"{r.number:02d}-{r.label or 'run'}")
        results.write_json(dest / "session.json", {
            "experiment": str(self.experiment), "sets": self.base_sets, "knobs": self.overrides,
            "runs": [{"number": r.number, "label": r.label, "command": r.command, "folder": str(r.run_dir),
                      "status": r.summary.get("status")} for r in self.runs]})
        (dest / "commands.lab").write_text("".join(f"{line}\n" for line in transcript))
        return dest


def results_summary(run_dir: Path) -> dict:
    import json

    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {"status": "failed", "error": "no summary.json"}


def install_exit_handlers() -> dict:
    """SIGTERM and SIGHUP leave the lab through the same teardown as quit; returns the old ones."""
    return {s: signal.signal(s, _raise_lab_exit) for s in (signal.SIGTERM, signal.SIGHUP)}


__all__ = ["LabExit", "LabRun", "LabSession", "SpecError", "install_exit_handlers", "no_interrupts"]
