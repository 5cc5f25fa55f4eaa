"""A run's port settings as plain JSON (ports.model.port_args): what each machine of a fabric
over several machines gets, must build exactly the ports the run builds from its spec."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fabric_emu.ports.model import port_args, port_plan, port_plan_from_args, settings_of, watchdog_timers
from fabric_emu.run.prepare import load_checked

EXPERIMENTS = sorted((Path(__file__).resolve().parents[2] / "experiments").glob("*.yaml"))


def from_spec(spec, plan):
    """The run's own construction, spelled out."""
    r = spec.pfc.nic_receive
    return port_plan(plan, *settings_of(spec), watchdog=watchdog_timers(spec), watchdog_ports=spec.pfcwd.ports,
                     seed=spec.seed, nic_stall_guard_s=spec.pfc.nic_stall_guard,
                     nic_receive=(r.drain, r.buffer, r.xoff, r.xon) if r else None)


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.stem)
def test_port_args_survive_json_and_build_the_same_ports(path: Path) -> None:
    spec, plan, _ = load_checked(path, [], probe=lambda: (False, "no module"), plan_only=True)
    args = json.loads(json.dumps(port_args(spec)))
    assert port_plan_from_args(plan, args) == from_spec(spec, plan)


def test_a_storm_lab_s_watchdog_and_nic_buffers_go_along() -> None:
    spec, plan, _ = load_checked(Path(EXPERIMENTS[0]).parent / "pfc-storm.yaml",
                                 ["pfcwd.enabled=true", "pfc.nic_receive.drain=50Gbps"], probe=lambda: (False, "no module"),
                                 plan_only=True)
    built = port_plan_from_args(plan, json.loads(json.dumps(port_args(spec))))
    assert built.watchdog is not None and built.nic_receive is not None
