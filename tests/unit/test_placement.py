"""Placement of a fabric over machines by fabric unit (fabric_emu.topo.placement, issue 19)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from fabric_emu.run.prepare import check_spec
from fabric_emu.run.show import print_plan
from fabric_emu.spec.errors import SpecError
from fabric_emu.spec.experiment import ExperimentSpec
from fabric_emu.spec.load import load_topology
from fabric_emu.spec.machines import fits_underlay, underlay_mtu_needed
from fabric_emu.topo.placement import PlacementError, fabric_units, place
from fabric_emu.topo.plan import FabricPlan, build_plan
from tests.unit.test_custom_topology import custom

TOPOLOGIES = Path(__file__).resolve().parents[2] / "topologies"


def plan_of(name: str, *sets: str) -> FabricPlan:
    return build_plan(load_topology(TOPOLOGIES / name, list(sets)))


def check_whole_units(plan: FabricPlan, machines: list[str]) -> dict[str, str]:
    """Place, then check what every placement must hold; returns machine_of."""
    p = place(plan, machines)
    where = p.machine_of
    assert set(where) == {s.name for s in plan.switches} | {h.name for h in plan.hosts}
    for unit in p.units:
        assert len({where[n] for n in (*unit.switches, *unit.hosts)}) == 1, unit
    assert all(where[h.name] == where[h.leaf] for h in plan.hosts)  # a host link never crosses
    assert set(where.values()) == set(machines)  # every machine runs something
    assert {(ln.a, ln.b) for ln in p.cut} == {(ln.a, ln.b) for ln in plan.links if where[ln.a] != where[ln.b]}
    assert all(ln.kind == "fabric" for ln in p.cut)
    return where


def test_leaf_spine_keeps_each_leaf_with_its_hosts_and_spreads_the_spines():
    plan = plan_of("ls-2x4x2.yaml")
    where = check_whole_units(plan, ["a", "b"])
    # Neighbouring leaves share a machine (a ring numbered leaf by leaf crosses twice).
    assert [where[f"leaf{i}"] for i in range(1, 5)] == ["a", "a", "b", "b"]
    assert [where["spine1"], where["spine2"]] == ["a", "b"]
    p = place(plan, ["a", "b"])
    assert len(p.cut) == 4  # each leaf's uplink to the other machine's spine
    assert {frozenset((where[ln.a], where[ln.b])) for ln in p.cut} == {frozenset("ab")}


def test_uneven_machines_get_contiguous_shares_and_never_nothing():
    plan = plan_of("ls-2x4x2.yaml", "leaves=5")
    where = check_whole_units(plan, ["a", "b", "c"])
    shares = [where[f"leaf{i}"] for i in range(1, 6)]
    assert shares == sorted(shares)  # contiguous runs, in machine order
    assert {shares.count(m) for m in "abc"} <= {1, 2}
    # One big unit first: the others still get one each.
    big = custom(["a", "b", "c", "s"], [*((f"h{i}", "a") for i in range(6)), ("x", "b"), ("y", "c")],
                 [("a", "s"), ("b", "s"), ("c", "s")])
    where = check_whole_units(big, ["m1", "m2", "m3"])
    assert [where[x] for x in "abc"] == ["m1", "m2", "m3"]


def test_fat_tree_pods_stay_whole_and_cores_spread():
    plan = plan_of("fat-tree-k4.yaml")
    units = fabric_units(plan)
    assert len(units) == 4 and all(len(u.switches) == 4 and len(u.hosts) == 4 for u in units)  # k=4: 4 pods
    where = check_whole_units(plan, ["a", "b"])
    cores = [s.name for s in plan.switches if s.role == "core"]
    assert sorted(where[c] for c in cores) == ["a", "a", "b", "b"]
    assert all({plan.switch_by_name[n].role for n in (ln.a, ln.b)} == {"agg", "core"}
               for ln in place(plan, ["a", "b"]).cut)


def test_rail_groups_stay_whole_and_one_group_cannot_be_split():
    plan = plan_of("rail-2x2x2.yaml")
    units = fabric_units(plan)
    assert len(units) == 2  # a group's rail leaves are joined through its servers' NICs
    where = check_whole_units(plan, ["a", "b"])
    assert where["srv1n1"] == where["srv1n2"] != where["srv3n1"] == where["srv3n2"]
    with pytest.raises(PlacementError, match="3 machines need at least 3 fabric units; this fabric has 2 "
                                             r"\(rail groups\)"):
        place(plan, ["a", "b", "c"])


def test_custom_leaves_are_units_and_links_between_leaves_may_be_cut():
    plan = build_plan(load_topology(TOPOLOGIES / "ring4.yaml"))
    assert len(fabric_units(plan)) == len(plan.leaves)
    where = check_whole_units(plan, ["a", "b"])
    cut = place(plan, ["a", "b"]).cut
    assert len(cut) == 2 and all(where[ln.a] != where[ln.b] for ln in cut)  # a ring cut in two crosses twice


def test_underlay_mtu_holds_a_full_frame_in_vxlan():
    # outer IPv4 20 + UDP 8 + VXLAN 8 + the inner Ethernet frame (14 + MTU)
    assert underlay_mtu_needed(4200) == 4250
    assert underlay_mtu_needed(1500) == 1550


def test_an_underlay_fits_from_the_mtu_it_needs_up():
    assert fits_underlay(4200, 4250) and fits_underlay(4200, 9000)
    assert not fits_underlay(4200, 4249) and not fits_underlay(4200, 1500)
    assert fits_underlay(1500, 1550) and not fits_underlay(1500, 1500)  # a 1500-byte fabric needs more than 1500


def experiment(**extra) -> ExperimentSpec:
    return ExperimentSpec.model_validate({
        "name": "e", "topology": {"name": "t", "kind": "leaf-spine", "spines": 2, "leaves": 4, "hosts_per_leaf": 2},
        "workload": {"type": "allreduce", "size": "1MB"}, **extra})


MACHINES = [{"name": "head", "address": "192.0.2.1"}, {"name": "b", "address": "2001:db8::2"}]


def test_show_prints_the_placement_and_the_cut_and_what_cannot_run_split_is_refused():
    spec = experiment(machines=MACHINES)
    _, plan, ranks = check_spec(spec, "exp.yaml", plan_only=True)
    out = Console(width=220, record=True, file=io.StringIO())
    print_plan(out, plan, spec, ranks)
    text = out.export_text()
    assert "placement by fabric unit" in text
    assert "4 of 8 fabric links cross machines" in text and "MTU of at least 4250" in text
    row = next(line for line in text.splitlines() if "head (head)" in line)
    assert "spine1 leaf1 leaf2" in row and "h1 h2 h3 h4" in row
    _, runnable, _ = check_spec(spec, "exp.yaml")  # a run over the machines
    assert runnable.extra["placement"]["machines"] == ["head", "b"]
    with pytest.raises(SpecError, match="pfcwd: the PFC watchdog cannot run over several machines yet"):
        check_spec(experiment(machines=MACHINES, pfcwd={"enabled": True}), "exp.yaml")
    _, plain, _ = check_spec(experiment(), "exp.yaml")
    assert "placement" not in plain.extra


@pytest.mark.parametrize("machines, field, message", [
    ([MACHINES[0], {**MACHINES[1], "name": "head"}], "machines.1.name", "also machine 0's name"),
    ([MACHINES[0], {**MACHINES[1], "address": "192.0.2.1"}], "machines.1.address", "also machine 0's address"),
    ([MACHINES[0], {**MACHINES[1], "address": "$(id)"}], "machines.1.address", "not an IPv4 or IPv6 address"),
    ([MACHINES[0], {**MACHINES[1], "name": "B 2"}], "machines.1.name", "String should match pattern"),
])
def test_machines_are_checked_before_they_reach_ssh(machines, field, message):
    with pytest.raises(Exception) as e:
        experiment(machines=machines)
    assert field in str(e.value).replace("\n  ", " ").replace("\n", " ") and message in str(e.value)
