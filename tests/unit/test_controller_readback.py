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
