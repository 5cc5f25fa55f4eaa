import json

import pytest

from fabric_emu.spec.topology import TopologySpec
from fabric_emu.topo.plan import FabricPlan, build_plan, roce_path_mtu


def plan(**kw) -> FabricPlan:
    base = dict(name="t", kind="leaf-spine", spines=2, leaves=4, hosts_per_leaf=2)
    return build_plan(TopologySpec(**{**base, **kw}))


def test_names_follow_the_documented_scheme():
    p = plan()
    assert [s.name for s in p.spines] == ["spine1", "spine2"]
    assert [s.name for s in p.leaves] == ["leaf1", "leaf2", "leaf3", "leaf4"]
    assert [h.name for h in p.hosts] == [f"h{i}" for i in range(1, 9)]
    assert [h.leaf for h in p.hosts[:3]] == ["leaf1", "leaf1", "leaf2"]


def test_ports_addresses_and_dpids_are_unique():
    p = plan(spines=4, leaves=8, hosts_per_leaf=4)
    assert len({h.ip for h in p.hosts}) == 32
    assert len({h.mac for h in p.hosts}) == 32
    assert len({s.dpid for s in p.switches}) == 12
    for sw in p.switches:
        ports = [x.port for x in p.ports(sw.name)]
        assert ports == sorted(set(ports))
    leaf = p.ports("leaf1")
    assert [x.peer for x in leaf] == ["h1", "h2", "h3", "h4", "spine1", "spine2", "spine3", "spine4"]
    assert [x.peer for x in p.ports("spine3")] == [f"leaf{j}" for j in range(1, 9)]
    assert all(len(x.intf) <= 15 for sw in p.switches for x in p.ports(sw.name))


def test_equal_cost_paths_cross_every_spine():
    p = plan(spines=4)
    paths = p.paths("h1", "h3")
    assert len(paths) == 4
    assert sorted(path[2] for path in paths) == ["spine1", "spine2", "spine3", "spine4"]
    assert p.paths("h1", "h2") == [["h1", "leaf1", "h2"]]


def test_rates_dilation_and_oversubscription():
    p = plan(hosts_per_leaf=4, host_link={"gbps": 100}, fabric_link={"gbps": 100}, dilation=1000)
    assert p.host_rate_bps("h1") == pytest.approx(100e6)
    assert p.oversubscription == pytest.approx(2.0)


def test_roce_mtu_follows_ethernet_mtu():
    assert roce_path_mtu(4200) == 4096
    assert roce_path_mtu(1500) == 1024
    assert plan(mtu=9000).roce_mtu == 4096


def test_json_round_trip():
    p = plan()
    again = FabricPlan.from_dict(json.loads(p.to_json()))
    assert again.to_dict() == p.to_dict()
    assert again.paths("h1", "h8") == p.paths("h1", "h8")
