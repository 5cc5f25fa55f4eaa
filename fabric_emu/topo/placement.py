"""Placement of a fabric over machines by fabric unit (issue 19): a leaf with its hosts (a rail
group on rail-optimized fabrics, a pod on fat-trees) stays on one machine and the top tier is
spread, so only uplinks cross machines. Pure: the plan in, the placement out.

Units are the connected pieces of the fabric once its top tier is taken away (spines, or a
fat-tree's cores); in a custom fabric every leaf with its hosts is a unit, since leaves may link
to each other directly. Units are dealt out in plan order in contiguous runs of about equal
host counts, so neighbouring leaves (and a ring's neighbouring ranks, numbered leaf by leaf)
share a machine; top-tier switches go round-robin in plan order.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from fabric_emu.topo.plan import TIER_OF_ROLE, FabricPlan, Link


class PlacementError(ValueError):
    """The fabric cannot be spread over these machines (too few units)."""


@dataclass(frozen=True)
class Unit:
    name: str  # its first switch (a leaf, a pod's first edge, a rail group's first leaf)
    switches: tuple[str, ...]
    hosts: tuple[str, ...]


@dataclass(frozen=True)
class Placement:
    machines: tuple[str, ...]  # the first is the head
    machine_of: dict[str, str]  # every switch and host
    units: tuple[Unit, ...]
    cut: tuple[Link, ...]  # fabric links whose two ends are on different machines

    def to_dict(self) -> dict:
        return {"machines": list(self.machines), "machine_of": self.machine_of,
                "units": [{"name": u.name, "switches": list(u.switches), "hosts": list(u.hosts)} for u in self.units],
                "cut": [f"{ln.a_intf}:{ln.b_intf}" for ln in self.cut]}


def top_tier(plan: FabricPlan) -> list[str]:
    """The switches spread over machines: those of the highest tier (custom fabrics: the
    switches without hosts); none when the fabric has one tier."""
    tiers = {s.name: TIER_OF_ROLE[s.role] for s in plan.switches}
    top = max(tiers.values())
    return [] if top == TIER_OF_ROLE["leaf"] else [name for name, t in tiers.items() if t == top]


def fabric_units(plan: FabricPlan) -> list[Unit]:
    """The pieces kept whole on one machine, in plan order."""
    spread = set(top_tier(plan))
    if plan.kind == "custom":
        pieces = [{leaf.name, *(h.name for h in plan.hosts if h.leaf == leaf.name)} for leaf in plan.leaves]
    else:
        g = nx.Graph(plan.graph.subgraph(n for n in plan.graph if n not in spread))
        for box in boxes(plan):  # a server's NICs share its engine, and its machine
            nx.add_path(g, box)
        pieces = list(nx.connected_components(g))
    order = {s.name: i for i, s in enumerate(plan.switches)}
    units = []
    for piece in pieces:
        switches = tuple(sorted((n for n in piece if n in order), key=order.__getitem__))
        hosts = tuple(h.name for h in plan.hosts if h.name in piece)
        units.append(Unit(switches[0], switches, hosts))
    return sorted(units, key=lambda u: order[u.name])


def boxes(plan: FabricPlan) -> list[tuple[str, ...]]:
    """Hosts that are NICs of one server: the plan's multi-GPU servers; on a rail-optimized
    fabric without `servers:`, the NICs srv<s>n1.. of each server s all the same."""
    if plan.servers:
        return [srv.hosts for srv in plan.servers]
    if plan.kind != "rail-optimized":
        return []
    by_server: dict[str, list[str]] = {}
    for h in plan.hosts:
        by_server.setdefault(h.name.rsplit("n", 1)[0], []).append(h.name)
    return [tuple(nics) for nics in by_server.values()]


def place(plan: FabricPlan, machines: list[str]) -> Placement:
    """Spread the plan's units and top tier over the machines (see the module's docstring)."""
    units = fabric_units(plan)
    if len(units) < len(machines):
        raise PlacementError(f"{len(machines)} machines need at least {len(machines)} fabric units; this fabric has "
                             f"{len(units)} ({unit_kind(plan)}): list at most {len(units)} machines")
    machine_of: dict[str, str] = {}
    total, done, m, taken = sum(len(u.hosts) for u in units), 0, 0, 0
    for k, unit in enumerate(units):
        past_share = (done + len(unit.hosts) / 2) * len(machines) > total * (m + 1)
        owed = len(units) - k == len(machines) - m  # every later machine still needs a unit
        if taken and m < len(machines) - 1 and (past_share or owed):
            m, taken = m + 1, 0
        machine_of.update({n: machines[m] for n in (*unit.switches, *unit.hosts)})
        done, taken = done + len(unit.hosts), taken + 1
    for i, name in enumerate(top_tier(plan)):
        machine_of[name] = machines[i % len(machines)]
    cut = tuple(ln for ln in plan.links if machine_of[ln.a] != machine_of[ln.b])
    return Placement(tuple(machines), machine_of, tuple(units), cut)


def unit_kind(plan: FabricPlan) -> str:
    """What a unit is in this kind of fabric, for people."""
    return {"fat-tree": "pods", "rail-optimized": "rail groups"}.get(plan.kind, "leaves with their hosts")
