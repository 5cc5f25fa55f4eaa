"""Warm start (controller/sync.py): given what a switch holds and what the core wants, the
messages that make one the other, and nothing when they already agree."""

from __future__ import annotations

import dataclasses

import pytest

from controller.core import (LB_COOKIE, Bucket, DecTtl, FabricCore, Flow, Group, LbOptions, Output, ResetSwitch,
                             ToGroup)
from controller.sync import (DeleteFlow, DeleteGroup, Unknown, flow_key, group_signature, observed_lb_mode,
                             plan_sync)
from fabric_emu.spec.topology import TopologySpec
from fabric_emu.topo.plan import FabricPlan, build_plan


@pytest.fixture(scope="module")
def plan() -> FabricPlan:
    return build_plan(TopologySpec(name="t", kind="leaf-spine", spines=2, leaves=4, hosts_per_leaf=2))


def _state(msgs: list) -> tuple[list[Flow], list[Group]]:
    """What a switch holds once it applied msgs (as the app reads it back: no modify flags)."""
    return ([m for m in msgs if isinstance(m, Flow)],
            [dataclasses.replace(m, modify=False) for m in msgs if isinstance(m, Group)])


def test_an_empty_switch_gets_everything_groups_first_and_no_reset(plan):
    want = FabricCore(plan).switch_up(plan.leaves[0].dpid)
    sync = plan_sync(want, [], [])
    assert not any(isinstance(m, (ResetSwitch, DeleteFlow, DeleteGroup)) for m in sync.messages)
    n_groups = sum(isinstance(m, Group) for m in want)
    assert n_groups and all(isinstance(m, Group) for m in sync.messages[:n_groups])
    assert sync.counts.groups_added == n_groups and sync.counts.flows_added == len(want) - 1 - n_groups
    assert sync.counts.messages == len(sync.messages)


@pytest.mark.parametrize("mode", ["ecmp", "spray", "dlb"])
def test_a_switch_that_holds_what_is_wanted_gets_nothing(plan, mode):
    core = FabricCore(plan, mode, LbOptions(4 if mode == "spray" else None))
    for sw in plan.switches:
        want = core.switch_up(sw.dpid)
        flows, groups = _state(want)
        sync = plan_sync(want, reversed(flows), groups)  # the switch's order is its own
        assert sync.messages == [] and sync.counts.messages == 0
        assert sync.counts.flows_kept == len(flows) and sync.counts.groups_kept == len(groups)


def test_only_the_difference_is_sent(plan):
    core = FabricCore(plan)
    leaf = plan.leaves[0]
    want = core.switch_up(leaf.dpid)
    flows, groups = _state(want)
    route = next(f for f in flows if f.priority == 200)
    changed = dataclasses.replace(route, actions=(DecTtl(), Output(3)))  # one route pinned by hand
    gone = flows[-1]  # one flow lost
    stray = Flow(1, 123, {"eth_type": 0x0800, "ipv4_dst": "10.9.9.9"}, ())  # one nobody wants
    ecmp = groups[0]
    held_groups = [dataclasses.replace(ecmp, buckets=ecmp.buckets[:1]), Group(77, "indirect", (Bucket(0, (Output(1),)),))]
    held = [changed if f is route else f for f in flows if f is not gone] + [stray]
    sync = plan_sync(want, held, held_groups)
    c = sync.counts
    assert (c.flows_added, c.flows_modified, c.flows_deleted) == (1, 1, 1)
    assert (c.groups_added, c.groups_modified, c.groups_deleted) == (0, 1, 1)
    assert sync.messages == [dataclasses.replace(ecmp, modify=True), route, gone,
                             DeleteFlow(stray.table, stray.priority, stray.match), DeleteGroup(77)]


def test_a_flow_with_an_action_the_app_could_not_read_is_replaced(plan):
    want = FabricCore(plan).switch_up(plan.spines[0].dpid)
    flows, groups = _state(want)
    odd = [dataclasses.replace(f, actions=(Unknown("OFPActionCopyTtlOut()"),)) if i == 0 else f
           for i, f in enumerate(flows)]
    sync = plan_sync(want, odd, groups)
    assert sync.messages == [flows[0]] and sync.counts.flows_modified == 1


def test_a_cookie_or_goto_difference_counts(plan):
    f = Flow(0, 100, {"in_port": 1}, (Output(2),), goto_table=1)
    assert plan_sync([f], [dataclasses.replace(f, goto_table=None)], []).counts.flows_modified == 1
    assert plan_sync([f], [dataclasses.replace(f, cookie=LB_COOKIE)], []).counts.flows_modified == 1
    # the match identifies a flow: another match is another flow
    other = dataclasses.replace(f, match={"in_port": 2})
    assert plan_sync([f], [other], []).counts.as_dict() | {} == {
        "flows_added": 1, "flows_modified": 0, "flows_deleted": 1, "groups_added": 0, "groups_modified": 0,
        "groups_deleted": 0, "flows_kept": 0, "groups_kept": 0, "messages": 2}
    assert flow_key(f) == flow_key(DeleteFlow(0, 100, {"in_port": 1}))


def test_group_hash_compares_as_a_set_with_its_seed():
    b = (Bucket(0, (Output(3),)), Bucket(1, (Output(4),)))
    g = Group(1, "select", b, ("ipv4_src", "ipv4_dst", "udp_src"), (("udp_dst", 0xFFF0),), hash_basis=7)
    read = Group(1, "select", b, ("udp_src", "ipv4_dst", "ipv4_src"), (("udp_dst", 0xFFF0),), hash_basis=7)
    assert group_signature(g) == group_signature(read)
    assert group_signature(g) != group_signature(dataclasses.replace(read, hash_basis=8))
    assert group_signature(g) != group_signature(dataclasses.replace(read, hash_masks=()))
    assert group_signature(g) != group_signature(dataclasses.replace(read, buckets=b[::-1]))


def test_desired_state_is_flows_and_groups_only():
    with pytest.raises(TypeError):
        plan_sync([ToGroup(1)], [], [])


def test_the_mode_a_leaf_shows(plan):
    leaf = plan.leaves[0].dpid
    for mode, opts in (("ecmp", LbOptions()), ("spray", LbOptions(4)), ("dlb", LbOptions())):
        flows, _ = _state(FabricCore(plan, mode, opts).switch_up(leaf))
        assert observed_lb_mode(flows) == mode
    assert observed_lb_mode([]) is None  # a switch nobody programmed: keep the configured mode
