"""A routed fabric: the os-ken controller and the Mininet fabric, up and down in the right order."""

from __future__ import annotations

import time
from pathlib import Path

from fabric_emu.fabric.controller import ControllerProcess, start_controller
from fabric_emu.fabric.build import Fabric
from fabric_emu.topo.plan import FabricPlan
from fabric_emu.ports import datapath
from fabric_emu.ports.model import PortPlan, default_settings, port_plan
from fabric_emu.ports.runtime import LosslessPorts
from fabric_emu.state.records import RunRecord


class RoutedFabric:
    """Used by `fabric-emu run` and the start-up benchmark, so both measure the same thing."""

    def __init__(self, plan: FabricPlan, record: RunRecord, workdir: Path, lb_mode: str = "ecmp",
                 ports: PortPlan | None = None, spray_entropies: int | None = None,
                 dlb: tuple[int, int] | None = None, wired: frozenset[frozenset[str]] = frozenset()):
        self.plan = plan
        self.wired = wired  # switch pairs whose link the run cuts (fabric_emu.fabric.wires)
        self.port_plan = ports or port_plan(plan, *default_settings(plan))
        self.ports: LosslessPorts | None = None
        self.pfc_stats: dict = {}
        self.record = record
        self.workdir = workdir
        self.lb_mode = lb_mode
        self.spray_entropies = spray_entropies
        self.dlb = dlb  # (flowlet gap ns, quality window ns), wall clock
        self.ctrl: ControllerProcess | None = None
        self.fabric: Fabric | None = None

    def up(self, ready_timeout_s: float) -> None:
        """Return once every switch is programmed. The controller boots while Mininet builds
        (most of our start-up margin over raw Mininet); switches start once it listens."""
        plan_path = self.workdir / "plan.json"
        plan_path.write_text(self.plan.to_json())
        dlb = (str(datapath.pin_dir(self.record.run_id)), *self.dlb) if self.dlb else None
        self.ctrl = start_controller(plan_path, self.workdir, lb_mode=self.lb_mode,
                                     spray_entropies=self.spray_entropies, dlb=dlb)
        if self.ctrl.rest_port:
            self.record.controller_url = self.ctrl.rest_url
        self.record.add_process(self.ctrl.pid, "controller")  # saves the record
        self.fabric = Fabric(self.plan, self.record, self.ctrl.port, self.port_plan, self.wired)
        self.fabric.build()
        self.ports = LosslessPorts(self.port_plan, self.record, self.workdir)
        self.ports.launch(self.fabric.netns_by_node())  # the PFC daemon boots while the switches start
        self.ctrl.wait_listening()
        self.fabric.start()
        self.ports.start()
        if not self.ctrl.wait_ready(ready_timeout_s):
            raise RuntimeError(f"the controller did not program all switches within {ready_timeout_s:.0f}s")
        if self.lb_mode == "dlb":
            self._wait_dlb(ready_timeout_s)

    def _wait_dlb(self, timeout_s: float) -> None:
        """The controller configures the flowlet stage once the port programs are loaded."""
        from fabric_emu.fabric.events import RestError, rest_call

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if rest_call(self.ctrl.rest_url, timeout=2.0).get("dlb", {}).get("ready"):
                    return
            except RestError:
                pass
            time.sleep(0.1)
        raise RuntimeError("the controller did not set the DLB stage up (see logs/controller.log)")

    def set_link(self, a: str, b: str, up: bool) -> dict:
        """Cut the link between switches a and b, or mend it. Cut, its ports' egress programs drop
        what Open vSwitch still sends them and give the bytes back (marked before the link goes,
        unmarked once it is back: no frame is charged to a link that cannot carry it), and what
        its queues and wire lost is given back once they are empty. Returns what the event
        record adds: `given_back_bytes`, for a cut."""
        assert self.fabric is not None and self.ports is not None
        ends = [p.intf for p in self.plan.link_ends(a, b)]
        given = self.ports.switch_link(ends, up, lambda on: self.fabric.set_link(a, b, on))
        return {} if up else {"given_back_bytes": given}

    def down(self) -> list[str]:
        """Stop whatever was started; returns the problems met (the run record's clean follows)."""
        problems = []
        if self.ports is not None:
            try:
                self.pfc_stats = self.ports.stop()
            except Exception as e:  # noqa: BLE001 - the record-based clean still runs
                problems.append(f"PFC daemon stop failed ({e})")
        if self.fabric is not None:
            try:
                self.fabric.stop()
            except Exception as e:  # noqa: BLE001 - the record-based clean still runs
                problems.append(f"fabric stop failed ({e})")
        if self.ctrl is not None:
            self.ctrl.stop()
        return problems
