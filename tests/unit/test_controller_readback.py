"""The app reads a switch's groups back (controller/app.py): os-ken 4's own parser fails on a
group with two buckets (it reads the next bucket as properties); the mended one must give back
the group the core sent, selection-method hash included, so a warm start sends nothing."""

from __future__ import annotations

import pytest

pytest.importorskip("os_ken")

from os_ken.ofproto import ofproto_v1_5 as ofp  # noqa: E402
from os_ken.ofproto import ofproto_v1_5_parser as parser  # noqa: E402
from os_ken.ofproto.ofproto_parser import msg as parse_msg  # noqa: E402

from controller import app  # noqa: E402
from controller.core import FabricCore, Group  # noqa: E402
from controller.sync import group_signature, plan_sync  # noqa: E402
from fabric_emu.spec.topology import TopologySpec  # noqa: E402
from fabric_emu.topo.plan import build_plan  # noqa: E402

# Open vSwitch 3.1's OFPMP_GROUP_DESC reply for leaf1 of the quickstart fabric (ls-2x4x2), as
# captured from a run: group 1, select, buckets out ports 3 and 4 (each with OVS's weight
# property), and the NTR selection method hashing ipv4_src, ipv4_dst, udp_src, udp_dst, basis 0x1001.
LEAF1_GROUP_DESC = bytes.fromhex(
    "061300a8ab60812300070000000000000098010000000001004000000000000000200010000000000000001000000003"
    "ffe5000000000000000000080001000000200010000000010000001000000004ffe50000000000000000000800010000"
    "ffff00440000154d000000010000000068617368000000000000000000000000000000000000100180001604ffffffff"
    "80001804ffffffff80001e02ffff80002002ffff00000000")


class _Datapath:
    ofproto = ofp
    ofproto_parser = parser


def test_ovs_group_desc_reads_back_as_the_group_the_core_sent():
    reply = parse_msg(_Datapath(), ofp.OFP_VERSION, ofp.OFPT_MULTIPART_REPLY, len(LEAF1_GROUP_DESC), 0,
                      LEAF1_GROUP_DESC)
    [group] = [app.from_ofp_group(st) for st in reply.body]
    plan = build_plan(TopologySpec(name="ls-2x4x2", kind="leaf-spine", spines=2, leaves=4, hosts_per_leaf=2))
    want = [m for m in FabricCore(plan).switch_up(plan.switch_by_name["leaf1"].dpid) if isinstance(m, Group)]
    assert [group_signature(group)] == [group_signature(g) for g in want]
    assert plan_sync(want, [], [group]).messages == []


def test_selection_method_round_trips_through_our_own_property():
    prop = app.NtrSelectionMethod("hash", ("ipv4_src", "udp_dst"), 42, masks=(("udp_src", 0xFFFC),))
    assert app._selection_method(bytes(prop.serialize())) == (("ipv4_src", "udp_dst"), (("udp_src", 0xFFFC),), 42)
    assert app._selection_method(b"") is None


def test_flow_actions_read_back():
    acts = [parser.OFPActionDecNwTtl(), parser.OFPActionSetField(eth_src="0E:FE:00:01:00:00"),
            parser.OFPActionGroup(1), parser.OFPActionOutput(ofp.OFPP_CONTROLLER), parser.OFPActionOutput(3),
            parser.OFPActionCopyTtlOut()]
    got = app.from_ofp_actions(acts)
    assert got[:5] == (app.DecTtl(), app.SetEthSrc("0e:fe:00:01:00:00"), app.ToGroup(1), app.ToController(),
                       app.Output(3))
    assert isinstance(got[5], app.Unknown)


class _SendingDatapath(_Datapath):
    def set_xid(self, msg) -> None:
        msg.xid = 1


@pytest.mark.parametrize("mode", ["ecmp", "spray", "dlb"])
def test_flows_read_back_as_the_core_sent_them(mode):
    """Every flow of a leaf and a spine, through os-ken's bytes and back (prefixes, masked UDP
    ports, the TTL matches, goto, cookies), then a hairpin route: what the app reads from a
    switch's flow descriptions equals what the core wants, so nothing is resent."""
    from controller.core import DecTtl, Flow, Hairpin, LbOptions, Output

    plan = build_plan(TopologySpec(name="t", kind="leaf-spine", spines=2, leaves=4, hosts_per_leaf=2))
    core = FabricCore(plan, mode, LbOptions(4 if mode == "spray" else None))
    flows = [m for sw in (plan.leaves[0], plan.spines[0]) for m in core.switch_up(sw.dpid) if isinstance(m, Flow)]
    flows.append(Flow(1, 200, {"eth_type": 0x0800, "ipv4_dst": ("10.0.2.0", "255.255.255.0")},
                      (DecTtl(), Hairpin(), Output(3))))
    for f in flows:
        [mod] = app.to_ofp(_SendingDatapath(), f)
        mod.serialize()
        back = parse_msg(_Datapath(), ofp.OFP_VERSION, ofp.OFPT_FLOW_MOD, len(mod.buf), 1, bytes(mod.buf))
        desc = parser.OFPFlowDesc(table_id=back.table_id, priority=back.priority, cookie=back.cookie,
                                  match=back.match, instructions=back.instructions)
        assert app.from_ofp_flow(desc) == f
