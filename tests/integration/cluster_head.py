"""A head that builds the 2 x 2 split fabric of test_cluster.py and then waits to be killed:
`python -m tests.integration.cluster_head '<json>'` prints UP once every machine runs its share.
Like a run, it names what it starts in a run record first (controller, ssh clients, workdir)."""

from __future__ import annotations

import json
from dataclasses import asdict
import sys
import time
from pathlib import Path

from fabric_emu.fabric.cluster import ClusterFabric
from fabric_emu.fabric.machines import Machine
from fabric_emu.fabric.controller import start_controller
from fabric_emu.ports.model import default_settings
from fabric_emu.spec.topology import TopologySpec
from fabric_emu.state.records import RunRecord
from fabric_emu.topo.placement import place
from fabric_emu.topo.plan import build_plan


def main(args: dict) -> None:
    rec = RunRecord.new(args["run_id"])
    workdir = rec.new_workdir()
    plan = build_plan(TopologySpec(name="fecl", kind="leaf-spine", spines=2, leaves=2, hosts_per_leaf=2))
    (workdir / "plan.json").write_text(plan.to_json())
    machines = [Machine(*m) for m in args["machines"]]
    ctl = start_controller(workdir / "plan.json", workdir)
    rec.add_process(ctl.pid, "controller")
    fabric = ClusterFabric(plan, place(plan, [m.name for m in machines]), machines, Path(args["ssh_config"]),
                           ctl.port, workdir, run_id=rec.run_id, ports={k: asdict(v) for k, v in zip(("ecn", "pfc"), default_settings(plan))}, record=rec)
    ctl.wait_listening()
    fabric.build()
    fabric.start()
    if not ctl.wait_ready(60):
        raise SystemExit("controller not ready")
    print("UP", flush=True)
    time.sleep(3600)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
