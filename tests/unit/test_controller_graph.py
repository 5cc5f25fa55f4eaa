"""FabricCore on fat-tree and rail-optimized plans: routes from the plan's graph at every switch.

Packets are walked through the messages each switch gets, over every bucket of every group, and
must reach their host by every equal-cost path of the plan and by no other path.
"""

from __future__ import annotations

import ipaddress

import pytest

from controller.core import (DEST_GROUP_BASE, ECMP_HASH_FIELDS, Conflict, DecTtl, FabricCore, Flow, Group, Output,
                             ResetSwitch, ToGroup, graph_routes, leaf_distances)
from fabric_emu.spec.topology import FatTreeSpec, RailOptimizedSpec
from fabric_emu.topo.plan import FabricPlan, Host, build_plan
from tests.unit.test_controller_core import _out_ports


def fat_tree(k: int) -> FabricPlan:
    return build_plan(FatTreeSpec(name="ft", kind="fat-tree", k=k))


def rail() -> FabricPlan:
    return build_plan(RailOptimizedSpec(name="r", kind="rail-optimized", groups=2, servers_per_group=2,
                                        nics_per_server=2, spines=2))


PLANS = {"fat-tree-k4": lambda: fat_tree(4), "fat-tree-k6": lambda: fat_tree(6), "rail": rail}


@pytest.fixture(scope="module", params=sorted(PLANS))
def plan(request) -> FabricPlan:
    return PLANS[request.param]()


def messages(core: FabricCore) -> dict[str, list]:
    return {s.name: core.switch_up(s.dpid) for s in core.plan.switches}


def walk(plan: FabricPlan, msgs: dict[str, list], src: Host, dst: Host) -> list[list[str]]:
    """Every node sequence a UDP packet from src to dst can take, over every bucket choice."""
    pkt = {"eth_type": 0x0800, "ipv4_src": src.ip, "ipv4_dst": dst.ip, "ip_proto": 17}
    done, walking = [], [[src.name, src.leaf]]
    while walking:
        path = walking.pop()
        assert len(path) <= 2 * len(plan.roles) + 1, f"loop or detour: {path}"
        ports = {p.port: p.peer for p in plan.ports(path[-1])}
        for out in _out_ports(msgs[path[-1]], pkt):
            (done if ports[out] in plan.host_by_name else walking).append(path + [ports[out]])
    return done


def test_every_switch_routes_every_leaf_prefix(plan):
    """Every switch has a route toward every destination /24: one output, or a select group
    over all its equal-cost next hops (hashed like the leaves' ECMP, with its own seed)."""
    core = FabricCore(plan)
    for sw in plan.switches:
        msgs = core.switch_up(sw.dpid)
        assert isinstance(msgs[0], ResetSwitch)
        groups = {m.group_id: m for m in msgs if isinstance(m, Group)}
        for leaf in plan.leaves:
            if leaf.name == sw.name:
                continue
            net = ipaddress.ip_network(f"10.0.{leaf.index}.0/24")
            route = next(m for m in msgs if isinstance(m, Flow) and m.match.get("ipv4_dst")
                         == (str(net.network_address), str(net.netmask)))
            dec, action = route.actions
            assert dec == DecTtl()
            hops = {p[p.index(sw.name) + 1] for p in plan.paths(sw.name, leaf.name)}
            port_to = {p.peer: p.port for p in plan.ports(sw.name)}
            if len(hops) == 1:
                assert action == Output(port_to[hops.pop()])
            else:
                group = groups[action.group_id]
                assert action == ToGroup(DEST_GROUP_BASE + leaf.index)
                assert group.type == "select" and group.hash_fields == ECMP_HASH_FIELDS
                assert group.hash_basis == sw.dpid
                assert sorted(b.actions[0].port for b in group.buckets) == sorted(port_to[h] for h in hops)


def test_every_host_reaches_every_host_by_every_equal_cost_path(plan):
    core = FabricCore(plan)
    msgs = messages(core)
    sources = plan.hosts if len(plan.hosts) <= 16 else plan.hosts[::7]  # k=6: some of each pod
    for src in sources:
        for dst in plan.hosts:
            if src is not dst:
                assert sorted(walk(plan, msgs, src, dst)) == plan.paths(src.name, dst.name)


def test_fat_tree_k4_has_four_paths_between_pods_through_select_groups():
    plan = fat_tree(4)
    msgs = messages(FabricCore(plan))
    paths = walk(plan, msgs, plan.host_by_name["h1"], plan.host_by_name["h16"])
    assert sorted(p[3] for p in paths) == ["core1", "core2", "core3", "core4"]
    # edges and aggs spread upward over groups; cores have one way down to a pod
    assert any(isinstance(m, Group) for m in msgs["edge1"]) and any(isinstance(m, Group) for m in msgs["agg1"])
    assert not any(isinstance(m, Group) for m in msgs["core1"])


def test_a_failed_link_is_routed_around_and_restored():
    plan = fat_tree(4)
    core = FabricCore(plan)
    msgs = messages(core)
    h1, h16 = plan.host_by_name["h1"], plan.host_by_name["h16"]
    changed = core.link_changed("agg1", "core1", up=False)
    assert set(changed) == {s.dpid for s in plan.switches}
    for sw in plan.switches:  # apply the changes as a switch would: groups replaced, flows overwritten
        msgs[sw.name] = _apply(msgs[sw.name], changed[sw.dpid])
    paths = walk(plan, msgs, h1, h16)
    assert len(paths) == 3 and not any("agg1" in p and "core1" in p for p in paths)
    assert any(isinstance(m, Group) and m.modify for m in changed[plan.switch_by_name["edge1"].dpid])
    restored = core.link_changed("agg1", "core1", up=True)
    for sw in plan.switches:
        msgs[sw.name] = _apply(msgs[sw.name], restored[sw.dpid])
    assert len(walk(plan, msgs, h1, h16)) == 4


def _apply(have: list, changes: list) -> list:
    """A switch's messages after a change: groups by id and flows by (table, priority, match) replaced."""
    def key(m):
        if isinstance(m, Group):
            return ("group", m.group_id)
        if isinstance(m, Flow):
            return ("flow", m.table, m.priority, tuple(sorted(m.match.items())))
        return ("other", id(m))
    out = {key(m): m for m in have}
    out.update({key(m): m for m in changes})
    return list(out.values())


def test_graph_routes_skip_leaves_cut_off():
    plan = rail()
    down = {frozenset(("g2rail1", "spine1")), frozenset(("g2rail1", "spine2"))}
    hops = graph_routes(plan, "g1rail1", down, leaf_distances(plan, down))
    assert "g2rail1" not in hops and [p.peer for p in hops["g2rail2"]] == ["spine1", "spine2"]


def test_spray_and_dlb_are_refused_on_graph_routed_fabrics():
    plan = rail()
    with pytest.raises(ValueError, match="leaf-spine"):
        FabricCore(plan, "spray")
    with pytest.raises(Conflict, match="leaf-spine"):
        FabricCore(plan).set_mode("dlb")
