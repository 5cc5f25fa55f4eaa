"""FabricCore's routing controls: TTL expiry and decrement, pinned paths, and local failover
(fast-failover groups), walked by hand over the messages each switch gets."""

from __future__ import annotations

import pytest

from controller.core import (LOCAL_GROUP_BASE, PINNED_COOKIE, PRIO_PINNED, PRIO_TTL_EXPIRED, TTL_COOKIE, DecTtl, DeleteFlows,
                             FabricCore, Flow, Group, Output, ToGroup, detours)
from fabric_emu.run.prepare import SpecError, check_paths, routing_of
from fabric_emu.spec.experiment import ExperimentSpec
from fabric_emu.spec.topology import TopologySpec
from fabric_emu.topo.plan import FabricPlan, build_plan
from tests.unit.test_custom_topology import ring4


def with_routing(plan: FabricPlan, paths=(), failover="global", convergence=None) -> FabricPlan:
    plan.extra["routing"] = {"paths": list(paths), "failover": failover, "convergence_wall_s": convergence}
    return plan


def ls(spines=3, leaves=4) -> FabricPlan:
    return build_plan(TopologySpec(name="t", kind="leaf-spine", spines=spines, leaves=leaves, hosts_per_leaf=1))


def _walk(core: FabricCore, src: str, dst: str, down: set[frozenset] = frozenset(), limit: int = 64) -> list[str]:
    """The switches a packet from src to dst visits, taking at each switch the best flow and, in
    a group, the first live bucket (ff) or the first live one of a select group: the path OVS
    would take for one hash. A loop ends at `limit` hops."""
    plan = core.plan
    s, d = plan.host_by_name[src], plan.host_by_name[dst]
    msgs = {sw.name: core.switch_up(sw.dpid) for sw in plan.switches}
    at, path = s.leaf, [s.leaf]
    while len(path) < limit:
        flows = sorted((m for m in msgs[at] if isinstance(m, Flow) and m.table == 1), key=lambda f: -f.priority)
        groups = {m.group_id: m for m in msgs[at] if isinstance(m, Group)}
        flow = next(f for f in flows if _hit(f.match, s.ip, d.ip))
        port = _port(flow.actions, groups, at, plan, down)
        peer = next(p.peer for p in plan.ports(at) if p.port == port)
        if peer == dst:
            return path
        at = peer
        path.append(at)
    return path


def _hit(match: dict, src_ip: str, dst_ip: str) -> bool:
    import ipaddress
    if match.get("eth_type") != 0x0800:
        return False
    if "ipv4_src" in match and match["ipv4_src"] != src_ip:
        return False
    want = match.get("ipv4_dst")
    if isinstance(want, tuple):
        return ipaddress.ip_address(dst_ip) in ipaddress.ip_network(f"{want[0]}/{want[1]}")
    return want == dst_ip


def _live(bucket, groups, at, plan, down) -> bool:
    if bucket.watch_port is not None:
        peer = next(p.peer for p in plan.ports(at) if p.port == bucket.watch_port)
        return frozenset((at, peer)) not in down
    if bucket.watch_group is not None:
        return any(_live(b, groups, at, plan, down) for b in groups[bucket.watch_group].buckets)
    return True


def _port(actions, groups, at, plan, down) -> int:
    for a in actions:
        if isinstance(a, Output):
            return a.port
        if isinstance(a, ToGroup):
            g = groups[a.group_id]
            live = [b for b in g.buckets if _live(b, groups, at, plan, down)]
            return _port(live[0].actions, groups, at, plan, down)
    raise AssertionError(f"no output in {actions}")


def test_every_route_decrements_the_ttl_and_table_0_kills_ttl_0_and_1_per_port():
    plan = ls()
    core = FabricCore(plan)
    for sw in plan.switches:
        msgs = core.switch_up(sw.dpid)
        routes = [m for m in msgs if isinstance(m, Flow) and m.table == 1 and m.match.get("eth_type") == 0x0800]
        assert routes and all(r.actions[0] == DecTtl() for r in routes if r.actions)
        expired = [m for m in msgs if isinstance(m, Flow) and m.cookie == TTL_COOKIE]
        assert {(f.match["in_port"], f.match["nw_ttl"]) for f in expired} == {
            (p.port, ttl) for p in plan.ports(sw.name) for ttl in (0, 1)}
        assert all(f.table == 0 and f.priority == PRIO_TTL_EXPIRED and f.actions == () for f in expired)


def test_dlb_rules_still_match_the_ttl_the_flowlet_stage_wrote_before_it_goes_down():
    core = FabricCore(ls(spines=2, leaves=2), "dlb")
    leaf = core.plan.leaves[0]
    dlb = [m for m in core.switch_up(leaf.dpid) if isinstance(m, Flow) and "nw_ttl" in m.match and m.table == 1]
    assert sorted(f.match["nw_ttl"] for f in dlb) == [192, 193]
    assert all(f.actions[0] == DecTtl() and isinstance(f.actions[1], Output) for f in dlb)


def test_a_pinned_path_is_taken_where_shortest_paths_would_go_the_other_way():
    plan = ring4()
    free = FabricCore(with_routing(ring4()))
    assert _walk(free, "h2", "h4") in (["r2", "r3", "r4"], ["r2", "r1", "r4"])
    for via in (["r2", "r3", "r4"], ["r2", "r1", "r4"]):
        core = FabricCore(with_routing(plan, [{"src": "h2", "dst": "h4", "via": via}]))
        assert _walk(core, "h2", "h4") == via
        pinned = [m for sw in plan.switches for m in core.switch_up(sw.dpid)
                  if isinstance(m, Flow) and m.priority == PRIO_PINNED]
        assert len(pinned) == 2  # at r2 and the middle switch; the last switch delivers as usual
        assert _walk(core, "h4", "h2") in (["r4", "r3", "r2"], ["r4", "r1", "r2"])  # the way back is free


def test_a_long_pinned_path_may_go_the_long_way_round():
    core = FabricCore(with_routing(ring4(), [{"src": "h1", "dst": "h2", "via": ["r1", "r4", "r3", "r2"]}]))
    assert _walk(core, "h1", "h2") == ["r1", "r4", "r3", "r2"]


def test_local_failover_detours_at_the_switch_with_the_failed_link():
    plan = with_routing(ls(), failover="local")
    core = FabricCore(plan)
    assert core.by_graph
    spine1 = plan.switch_by_name["spine1"]
    msgs = core.switch_up(spine1.dpid)
    ff = {m.group_id: m for m in msgs if isinstance(m, Group) and m.type == "ff"}
    g = ff[LOCAL_GROUP_BASE + 2]  # toward leaf2
    ports = {p.port: p.peer for p in plan.ports("spine1")}
    assert ports[g.buckets[0].watch_port] == "leaf2"
    assert sorted(ports[b.watch_port] for b in g.buckets[1:]) == ["leaf1", "leaf3", "leaf4"]
    # with spine1-leaf2 down, h4's packets to h2 through spine1 bounce off another leaf
    down = {frozenset(("spine1", "leaf2"))}
    path = _walk(core, "h4", "h2", down)
    assert path[0] == "leaf4"
    if path[1] == "spine1":
        assert path[2] != "leaf2" and path[2].startswith("leaf")


def test_detours_rotate_with_the_switch_and_leave_out_the_primary():
    plan = ls()
    first = {s: detours(plan, s, "leaf2", {"leaf2"})[0].peer for s in ("spine1", "spine2", "spine3")}
    assert "leaf2" not in first.values() and len(set(first.values())) == 3


def test_local_failover_leaves_dead_select_buckets_out_and_a_leaf_ecmps_on():
    plan = with_routing(ls(), failover="local")
    core = FabricCore(plan)
    msgs = core.switch_up(plan.switch_by_name["leaf1"].dpid)
    select = [m for m in msgs if isinstance(m, Group) and m.type == "select"]
    assert select and all(b.watch_port is not None for g in select for b in g.buckets)
    down = {frozenset(("leaf1", "spine1")), frozenset(("leaf1", "spine2"))}
    assert _walk(core, "h1", "h2", down) == ["leaf1", "spine3", "leaf2"]


def test_a_loop_dies_by_ttl_not_by_the_walker():
    """A leaf cut off from both spines of a two-spine fabric, with local failover and no
    convergence: packets to it bounce between spines and leaves for ever (TTL ends them)."""
    plan = with_routing(ls(spines=2, leaves=3), failover="local")
    core = FabricCore(plan)
    down = {frozenset(("spine1", "leaf3")), frozenset(("spine2", "leaf3"))}
    assert len(_walk(core, "h1", "h3", down, limit=40)) == 40


def test_dlb_and_spray_are_refused_with_local_failover():
    with pytest.raises(ValueError, match="failover: local"):
        FabricCore(with_routing(ls(), failover="local"), "dlb")


@pytest.mark.parametrize("path, field, words", [
    ({"src": "h9", "dst": "h3", "via": ["r1", "r2", "r3"]}, "paths.0.src", "unknown host 'h9'"),
    ({"src": "h1", "dst": "h3", "via": ["r1", "r7", "r3"]}, "paths.0.via.1", "unknown switch 'r7'"),
    ({"src": "h1", "dst": "h3", "via": ["r2", "r3"]}, "paths.0.via", "must start at h1's switch r1"),
    ({"src": "h1", "dst": "h3", "via": ["r1", "r3"]}, "paths.0.via.1", "no link between r1 and r3"),
])
def test_pinned_paths_are_checked_against_the_plan(path, field, words):
    plan = ring4()
    spec = ExperimentSpec.model_validate({"name": "p", "topology": plan_topology(), "paths": [path],
                                          "workload": {"type": "flows", "flows": [{"src": "h1", "dst": "h3", "size": "1MB"}]}})
    with pytest.raises(SpecError) as e:
        check_paths(spec, plan, "x.yaml")
    (where, got_field, message), = e.value.problems
    assert got_field == field and words in message


def test_a_pinned_path_may_not_repeat_a_switch_nor_a_pair():
    with pytest.raises(ValueError, match="appears twice"):
        ExperimentSpec.model_validate({"name": "p", "topology": plan_topology(),
                                       "paths": [{"src": "h1", "dst": "h3", "via": ["r1", "r2", "r1"]}],
                                       "workload": {"type": "flows", "flows": [{"src": "h1", "dst": "h3"}]}})
    spec = ExperimentSpec.model_validate({"name": "p", "topology": plan_topology(),
                                          "paths": [{"src": "h1", "dst": "h3", "via": ["r1", "r2", "r3"]}] * 2,
                                          "workload": {"type": "flows", "flows": [{"src": "h1", "dst": "h3", "size": "1MB"}]}})
    with pytest.raises(SpecError, match="pinned twice"):
        check_paths(spec, ring4(), "x.yaml")


def test_failover_reads_as_a_word_or_a_mapping_and_converges_in_wall_time():
    base = {"name": "p", "topology": plan_topology(), "workload": {"type": "flows", "flows": [{"src": "h1", "dst": "h3", "size": "1MB"}]}}
    assert ExperimentSpec.model_validate({**base, "failover": "local"}).failover.mode == "local"
    spec = ExperimentSpec.model_validate({**base, "failover": {"mode": "local", "convergence": "2ms"}})
    plan = ring4()
    assert routing_of(spec, plan)["convergence_wall_s"] == pytest.approx(0.002 * plan.dilation)
    never = ExperimentSpec.model_validate({**base, "failover": {"mode": "local", "convergence": "never"}})
    assert routing_of(never, plan)["convergence_wall_s"] is None
    with pytest.raises(ValueError):
        ExperimentSpec.model_validate({**base, "failover": "sometimes"})


def plan_topology() -> dict:
    import yaml
    from pathlib import Path
    return yaml.safe_load((Path(__file__).parents[2] / "topologies" / "ring4.yaml").read_text())


def test_with_global_failover_a_pinned_path_over_a_failed_link_gives_way_to_the_routes():
    plan = with_routing(ls(), [{"src": "h2", "dst": "h1", "via": ["leaf2", "spine1", "leaf1"]}])
    core = FabricCore(plan)
    assert _walk(core, "h2", "h1") == ["leaf2", "spine1", "leaf1"]
    msgs = core.link_changed("spine1", "leaf1", up=False)
    spine1 = plan.switch_by_name["spine1"].dpid
    assert any(isinstance(m, DeleteFlows) and m.cookie == PINNED_COOKIE for m in msgs[spine1])
    assert not any(isinstance(m, Flow) and m.priority == PRIO_PINNED for m in msgs[spine1])
    back = core.link_changed("spine1", "leaf1", up=True)
    assert any(isinstance(m, Flow) and m.priority == PRIO_PINNED for m in back[spine1])
