"""FabricCore with no switch: what each switch gets, and packets walked through it by hand.

The 2 spines x 4 leaves x 2 hosts plan: leaf ports 1-2 face hosts, 3-4 face spine1-2.
"""

from __future__ import annotations

import ipaddress

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import ARP, Ether

from controller.core import (ECMP_HASH_FIELDS, FabricCore, Flow, Group, LbOptions, Output, PacketOut,
                             ResetSwitch, ToController, ToGroup)
from fabric_emu.lb import spray
from fabric_emu.spec.topology import TopologySpec
from fabric_emu.topo.plan import FabricPlan, Host, build_plan


@pytest.fixture(scope="module")
def plan() -> FabricPlan:
    spec = TopologySpec(name="t", kind="leaf-spine", spines=2, leaves=4, hosts_per_leaf=2)
    return build_plan(spec)


@pytest.fixture(scope="module")
def core(plan: FabricPlan) -> FabricCore:
    return FabricCore(plan, "ecmp")


# --------------------------------------------------------------------------- a hand-walker
def _matches(match: dict, pkt: dict) -> bool:
    for field, want in match.items():
        have = pkt.get(field)
        if isinstance(want, tuple) and isinstance(want[0], int):  # (value, bit mask)
            if have is None or have & want[1] != want[0]:
                return False
        elif isinstance(want, tuple):  # (address, mask)
            net = ipaddress.ip_network(f"{want[0]}/{want[1]}")
            if have is None or ipaddress.ip_address(have) not in net:
                return False
        elif have != want:
            return False
    return True


def _out_ports(msgs: list, pkt: dict) -> list[int]:
    """Every port the best-matching flow may send pkt to (each bucket of a group counts)."""
    flows = sorted((m for m in msgs if isinstance(m, Flow)), key=lambda f: -f.priority)
    groups = {m.group_id: m for m in msgs if isinstance(m, Group)}
    flow = next(f for f in flows if _matches(f.match, pkt))
    actions = []
    for a in flow.actions:
        if isinstance(a, ToGroup):
            actions += [ba for b in groups[a.group_id].buckets for ba in b.actions]
        else:
            actions.append(a)
    return [a.port for a in actions if isinstance(a, Output)]


def _paths(plan: FabricPlan, core: FabricCore, src: Host, dst: Host, longest: int = 5) -> list[list[str]]:
    """Every node sequence a UDP packet from src to dst can take, over every bucket choice; a
    longer one (`longest` nodes, hosts included) fails as a loop or a detour."""
    msgs = {s.name: core.switch_up(s.dpid) for s in plan.switches}
    pkt = {"eth_type": 0x0800, "ipv4_src": src.ip, "ipv4_dst": dst.ip, "ip_proto": 17}
    done, walking = [], [[src.name, src.leaf]]
    while walking:
        path = walking.pop()
        assert len(path) <= longest, f"loop or detour: {path}"
        ports = {p.port: p.peer for p in plan.ports(path[-1])}
        for out in _out_ports(msgs[path[-1]], pkt):
            nxt = path + [ports[out]]
            (done if ports[out] in plan.host_by_name else walking).append(nxt)
    return done


# --------------------------------------------------------------------------- what switches get
def test_every_leaf_has_one_select_group_over_its_uplinks(plan, core):
    for leaf in plan.leaves:
        groups = [m for m in core.switch_up(leaf.dpid) if isinstance(m, Group)]
        assert len(groups) == 1
        group = groups[0]
        assert group.type == "select"
        bucket_ports = sorted(b.actions[0].port for b in group.buckets)
        assert bucket_ports == [p.port for p in plan.uplinks(leaf.name)]
        assert "udp_src" in group.hash_fields
        assert group.hash_fields == ECMP_HASH_FIELDS


def test_spines_have_no_groups(plan, core):
    for spine in plan.spines:
        assert not [m for m in core.switch_up(spine.dpid) if isinstance(m, Group)]


def test_switch_up_resets_first_then_groups_then_flows_ending_in_drop(plan, core):
    msgs = core.switch_up(plan.leaves[0].dpid)
    assert isinstance(msgs[0], ResetSwitch)
    group_at = [i for i, m in enumerate(msgs) if isinstance(m, Group)]
    flow_at = [i for i, m in enumerate(msgs) if isinstance(m, Flow)]
    assert max(group_at) < min(flow_at)  # a flow may only point at an existing group
    lowest = min((m for m in msgs if isinstance(m, Flow)), key=lambda f: f.priority)
    assert (lowest.match, lowest.actions) == ({}, ())
    arp = [m for m in msgs if isinstance(m, Flow) and m.match.get("eth_type") == 0x0806]
    assert [f.actions for f in arp] == [(ToController(),)]


def test_h1_reaches_every_host_through_every_uplink(plan, core):
    h1 = plan.host_by_name["h1"]
    for dst in plan.hosts[1:]:
        paths = _paths(plan, core, h1, dst)
        assert {p[-1] for p in paths} == {dst.name}
        assert all(p[-2] == dst.leaf for p in paths)
        if dst.leaf == h1.leaf:
            assert paths == [["h1", h1.leaf, dst.name]]
        else:
            assert sorted(p[2] for p in paths) == [s.name for s in plan.spines]


def test_spines_route_every_leaf_prefix(plan, core):
    for spine in plan.spines:
        msgs = core.switch_up(spine.dpid)
        port_to = {p.peer: p.port for p in plan.ports(spine.name)}
        for leaf in plan.leaves:
            prefix = ipaddress.ip_network(f"10.0.{leaf.index}.0/24")
            dst = str(prefix.network_address + 200)  # any address of the prefix, planned or not
            assert _out_ports(msgs, {"eth_type": 0x0800, "ipv4_dst": dst}) == [port_to[leaf.name]]


def test_unknown_dpid_raises(core):
    with pytest.raises(KeyError):
        core.switch_up(0xDEAD)


# --------------------------------------------------------------------------- proxy ARP
def _arp_request(asker: Host, target_ip: str, op: int = 1) -> bytes:
    return bytes(Ether(src=asker.mac, dst="ff:ff:ff:ff:ff:ff")
                 / ARP(op=op, hwsrc=asker.mac, psrc=asker.ip, pdst=target_ip))


def test_arp_request_for_h5_is_answered_with_h5_mac(plan, core):
    h1, h5 = plan.host_by_name["h1"], plan.host_by_name["h5"]
    leaf1 = plan.switch_by_name[h1.leaf]
    out = core.packet_in(leaf1.dpid, h1.leaf_port, _arp_request(h1, h5.ip))
    assert len(out) == 1 and isinstance(out[0], PacketOut)
    assert out[0].out_port == h1.leaf_port
    reply = Ether(out[0].data)
    assert (reply.src, reply.dst) == (h5.mac, h1.mac)
    arp = reply[ARP]
    assert (arp.op, arp.hwsrc, arp.psrc, arp.hwdst, arp.pdst) == (2, h5.mac, h5.ip, h1.mac, h1.ip)


def test_arp_for_unplanned_or_own_address_is_ignored(plan, core):
    h1 = plan.host_by_name["h1"]
    leaf1 = plan.switch_by_name[h1.leaf]
    assert core.packet_in(leaf1.dpid, h1.leaf_port, _arp_request(h1, "10.0.9.9")) == []
    assert core.packet_in(leaf1.dpid, h1.leaf_port, _arp_request(h1, h1.ip)) == []


def test_non_arp_request_packet_in_produces_nothing(plan, core):
    h1, h5 = plan.host_by_name["h1"], plan.host_by_name["h5"]
    leaf1 = plan.switch_by_name[h1.leaf]
    udp = Ether(src=h1.mac, dst=h5.mac) / IP(src=h1.ip, dst=h5.ip) / UDP(sport=49152, dport=4791)
    assert core.packet_in(leaf1.dpid, h1.leaf_port, bytes(udp)) == []
    assert core.packet_in(leaf1.dpid, h1.leaf_port, _arp_request(h1, h5.ip, op=2)) == []
    assert core.packet_in(leaf1.dpid, h1.leaf_port, b"\x00" * 10) == []


# --------------------------------------------------------------------------- modes
def test_dlb_sends_each_ttl_value_up_its_uplink_and_masks_what_cannot_reach(plan):
    """The flowlet stage marks its choice of uplink i as TTL 192 + i; the leaf's rules follow
    it. Its allowed masks leave out uplinks whose spine lost the destination."""
    core = FabricCore(plan, "dlb")
    leaf1, leaf2 = plan.leaves[0], plan.leaves[1]
    msgs = core.switch_up(leaf1.dpid)
    h1, h3 = plan.host_by_name["h1"], plan.host_by_name["h3"]
    ups = plan.uplinks(leaf1.name)
    for i, p in enumerate(ups):
        pkt = {"eth_type": 0x0800, "ipv4_src": h1.ip, "ipv4_dst": h3.ip, "ip_proto": 17, "nw_ttl": 192 + i}
        assert _out_ports(msgs, pkt) == [p.port]
    plain = {"eth_type": 0x0800, "ipv4_src": h1.ip, "ipv4_dst": h3.ip, "ip_proto": 17, "nw_ttl": 64}
    assert sorted(_out_ports(msgs, plain)) == sorted(p.port for p in ups)  # unmarked: ECMP
    everyone = (1 << len(ups)) - 1
    assert core.dlb_allowed(leaf1) == {core.leaf_number(l): everyone for l in plan.leaves[1:]}
    core.link_changed(leaf2.name, ups[0].peer, up=False)  # spine1 lost leaf2
    allowed = core.dlb_allowed(leaf1)
    assert allowed[core.leaf_number(leaf2)] == everyone & ~1
    assert allowed[core.leaf_number(plan.leaves[2])] == everyone


@pytest.mark.parametrize("spines,entropies", [(4, None), (4, 16), (2, None), (3, None)])
def test_spray_sends_each_entropy_value_up_its_own_uplink(spines, entropies):
    """A QP's UDP source ports (fabric_emu.lb.spray.entropy_ports) map onto the uplinks exactly as
    spray.shares says; traffic that is not UDP still goes through the ECMP group."""
    plan = build_plan(TopologySpec(name="t", kind="leaf-spine", spines=spines, leaves=2,
                                   hosts_per_leaf=1))
    core = FabricCore(plan, "spray", LbOptions(entropies))
    h1, h2 = plan.host_by_name["h1"], plan.host_by_name["h2"]
    leaf1 = plan.switch_by_name[h1.leaf]
    msgs = core.switch_up(leaf1.dpid)
    n = entropies or spray.default_entropies(spines)
    uplink_of_port = {p.port: p.peer for p in plan.uplinks(leaf1.name)}
    per_uplink: dict[str, int] = {}
    for sport in spray.entropy_ports(0xC123, n):
        pkt = {"eth_type": 0x0800, "ipv4_src": h1.ip, "ipv4_dst": h2.ip, "ip_proto": 17,
               "udp_src": sport, "udp_dst": 4791}
        (out,) = _out_ports(msgs, pkt)  # one uplink, no group
        per_uplink[uplink_of_port[out]] = per_uplink.get(uplink_of_port[out], 0) + 1
    assert sorted(c / n for c in per_uplink.values()) == sorted(spray.shares(n, spines))
    assert len(per_uplink) == spines
    tcp = {"eth_type": 0x0800, "ipv4_src": h1.ip, "ipv4_dst": h2.ip, "ip_proto": 6}
    assert sorted(_out_ports(msgs, tcp)) == sorted(uplink_of_port)  # the ECMP group's buckets
    local = {"eth_type": 0x0800, "ipv4_dst": h1.ip, "ip_proto": 17, "udp_src": 0xC000}
    assert _out_ports(msgs, local) == [h1.leaf_port]  # a local host is not sprayed


def test_unknown_mode_raises(plan):
    with pytest.raises(ValueError, match="unknown load balancing"):
        FabricCore(plan, "random")


# --------------------------------------------------------------------------- link faults
def _route_ports(msgs: list, pkt: dict) -> set[int]:
    return set(_out_ports(msgs, pkt))


@pytest.mark.parametrize("mode", ["ecmp", "spray"])
def test_a_failed_link_is_routed_around_by_every_leaf_and_restored(mode):
    plan = build_plan(TopologySpec(name="t", kind="leaf-spine", spines=4, leaves=3, hosts_per_leaf=1))
    core = FabricCore(plan, mode, LbOptions(4))
    h1, h2, h3 = (plan.host_by_name[h] for h in ("h1", "h2", "h3"))
    leaves = {leaf.name: leaf for leaf in plan.leaves}
    msgs = {leaf.dpid: core.switch_up(leaf.dpid) for leaf in plan.leaves}
    port_to = {name: {p.peer: p.port for p in plan.uplinks(name)} for name in leaves}

    def ports_used(src, dst, leaf_msgs):
        pkt = {"eth_type": 0x0800, "ipv4_src": src.ip, "ipv4_dst": dst.ip, "ip_proto": 17, "udp_dst": 4791}
        used = set()
        for sport in range(0xC000, 0xC000 + 64):  # every entropy value and many QPs
            used |= _route_ports(leaf_msgs, {**pkt, "udp_src": sport})
        return used

    def apply(old: list, new: list) -> list:
        """What the leaf holds after the new messages (adds replace the same match and
        priority, a cookie delete removes the mode's flows, groups are replaced by id)."""
        flows = {(f.table, f.priority, tuple(sorted(map(str, f.match.items())))): f
                 for f in old if isinstance(f, Flow)}
        groups = {g.group_id: g for g in old if isinstance(g, Group)}
        for m in new:
            if isinstance(m, Group):
                groups[m.group_id] = m
            elif isinstance(m, Flow):
                flows[(m.table, m.priority, tuple(sorted(map(str, m.match.items()))))] = m
            elif type(m).__name__ == "DeleteFlows":
                flows = {k: f for k, f in flows.items() if f.cookie != m.cookie}
        return [*groups.values(), *flows.values()]

    assert ports_used(h1, h2, msgs[leaves["leaf1"].dpid]) == set(port_to["leaf1"].values())
    changed = core.link_changed("leaf1", "spine2", up=False)
    assert set(changed) == {leaf.dpid for leaf in plan.leaves}
    after = {dpid: apply(msgs[dpid], changed[dpid]) for dpid in msgs}
    # leaf1 stops using spine2 for everyone; leaf2 stops using spine2 towards leaf1 only
    assert ports_used(h1, h2, after[leaves["leaf1"].dpid]) == set(port_to["leaf1"].values()) - {port_to["leaf1"]["spine2"]}
    assert ports_used(h2, h1, after[leaves["leaf2"].dpid]) == set(port_to["leaf2"].values()) - {port_to["leaf2"]["spine2"]}
    assert ports_used(h2, h3, after[leaves["leaf2"].dpid]) == set(port_to["leaf2"].values())
    new_groups = [g for g in changed[leaves["leaf2"].dpid] if isinstance(g, Group)]
    assert {g.modify for g in new_groups if g.group_id == 1} == {True}  # group 1 existed: modified
    back = core.link_changed("leaf1", "spine2", up=True)
    restored = {dpid: apply(after[dpid], back[dpid]) for dpid in msgs}
    assert ports_used(h2, h1, restored[leaves["leaf2"].dpid]) == set(port_to["leaf2"].values())
    assert ports_used(h1, h3, restored[leaves["leaf1"].dpid]) == set(port_to["leaf1"].values())
    assert core.link_of(leaves["leaf1"].dpid, port_to["leaf1"]["spine2"]) == ("leaf1", "spine2")
    assert core.link_of(leaves["leaf1"].dpid, h1.leaf_port) is None  # a host port
