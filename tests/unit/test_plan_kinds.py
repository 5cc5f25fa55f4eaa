"""Fat-tree and rail-optimized plans: counts, wiring, unique ids, equal-cost paths, bad input."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest

from fabric_emu.run.prepare import load_checked
from fabric_emu.spec.errors import SpecError
from fabric_emu.spec.load import load_experiment, load_topology
from fabric_emu.spec.topology import SWITCH_PORT_RE, FatTreeSpec, RailOptimizedSpec
from fabric_emu.topo.plan import FabricPlan, build_plan

REPO = Path(__file__).resolve().parents[2]


def fat_tree(k: int, **kw) -> FabricPlan:
    return build_plan(FatTreeSpec(name="ft", kind="fat-tree", k=k, **kw))


def rail(groups=2, servers=2, nics=2, spines=2, **kw) -> FabricPlan:
    return build_plan(RailOptimizedSpec(name="r", kind="rail-optimized", groups=groups, servers_per_group=servers,
                                        nics_per_server=nics, spines=spines, **kw))


def assert_unique_and_valid(p: FabricPlan) -> None:
    """Unique dpids, names, IPs, MACs; ports numbered without gaps from 1; names Linux takes."""
    assert len({s.dpid for s in p.switches}) == len(p.switches)
    assert len({n for n in [*p.switch_by_name, *p.host_by_name]}) == len(p.switches) + len(p.hosts)
    assert len({h.ip for h in p.hosts}) == len({h.mac for h in p.hosts}) == len(p.hosts)
    for sw in p.switches:
        ports = [x.port for x in p.ports(sw.name)]
        assert ports == list(range(1, len(ports) + 1)), sw.name
        assert all(re.match(SWITCH_PORT_RE, x.intf) and len(x.intf) <= 15 for x in p.ports(sw.name))
    # one /24 per leaf, numbered like the leaf: the controller routes by these prefixes
    for h in p.hosts:
        assert h.ip.rsplit(".", 1)[0] == f"10.0.{p.switch_by_name[h.leaf].index}"
    assert all(len(h.intf) <= 15 for h in p.hosts)


# --------------------------------------------------------------------------- fat-tree
@pytest.mark.parametrize("k", [4, 6])
def test_fat_tree_counts_and_roles(k):
    p = fat_tree(k)
    half = k // 2
    roles = {role: len(sws) for role, sws in p.roles.items()}
    assert roles == {"leaf": k * half, "agg": k * half, "core": half * half}
    assert len(p.hosts) == k ** 3 // 4
    assert len([ln for ln in p.links if ln.kind == "fabric"]) == 2 * k * half * half
    assert all(len(p.ports(sw.name)) == k for sw in p.switches)  # every switch has radix k
    assert_unique_and_valid(p)
    assert p.tier_oversubscription() == {"leaf": 1.0, "agg": 1.0}


@pytest.mark.parametrize("k", [4, 6])
def test_fat_tree_wiring_is_al_fares(k):
    p = fat_tree(k)
    half = k // 2
    pod = lambda name: (int(re.sub(r"\D", "", name)) - 1) // half  # noqa: E731 - agg/edge pod
    for edge in p.leaves:
        ports = p.ports(edge.name)
        assert [x.peer for x in ports[:half]] == [h.name for h in p.hosts if h.leaf == edge.name]
        aggs = [x.peer for x in ports[half:]]
        assert all(a.startswith("agg") and pod(a) == pod(edge.name) for a in aggs) and len(set(aggs)) == half
    for core in p.roles["core"]:
        peers = [x.peer for x in p.ports(core.name)]
        assert [pod(a) for a in peers] == list(range(k))  # port p faces pod p
        # core group a (cores (a-1)*k/2+1 .. a*k/2) joins the a-th agg of every pod
        a = (core.index - 1) // half
        assert all((int(x[3:]) - 1) % half == a for x in peers)


def test_fat_tree_k4_equal_cost_paths():
    p = fat_tree(4)
    for a, b in itertools.combinations([h.name for h in p.hosts], 2):
        ha, hb = p.host_by_name[a], p.host_by_name[b]
        paths = p.paths(a, b)
        if ha.leaf == hb.leaf:
            assert len(paths) == 1 and len(paths[0]) == 3
        elif (ha.index - 1) // 4 == (hb.index - 1) // 4:  # same pod (4 hosts a pod)
            assert len(paths) == 2 and len(paths[0]) == 5
        else:
            assert len(paths) == 4 and len(paths[0]) == 7
            assert sorted(path[3] for path in paths) == ["core1", "core2", "core3", "core4"]


def test_fat_tree_k6_paths_between_pods():
    p = fat_tree(6)
    assert len(p.paths("h1", "h54")) == 9 and len(p.paths("h1", "h4")) == 3


@pytest.mark.parametrize("k, why", [(5, "even"), (3, "greater than or equal to 4"), (2, "greater"),
                                    (14, "less than or equal to 12")])
def test_fat_tree_bad_k_is_an_input_error(tmp_path, k, why):
    (tmp_path / "t.yaml").write_text(f"name: t\nkind: fat-tree\nk: {k}\n")
    with pytest.raises(SpecError) as exc:
        load_topology(tmp_path / "t.yaml")
    (f, field, msg), = exc.value.problems
    assert f.endswith("t.yaml") and field == "k" and why in msg


def test_fat_tree_takes_no_leaf_spine_fields(tmp_path):
    (tmp_path / "t.yaml").write_text("name: t\nkind: fat-tree\nk: 4\nspines: 2\n")
    with pytest.raises(SpecError) as exc:
        load_topology(tmp_path / "t.yaml")
    assert exc.value.problems == [(str(tmp_path / "t.yaml"), "spines", "unknown key")]


def test_unknown_or_missing_kind_names_the_kinds(tmp_path):
    for text in ("name: t\nkind: torus\nk: 4\n", "name: t\nk: 4\n"):
        (tmp_path / "t.yaml").write_text(text)
        with pytest.raises(SpecError) as exc:
            load_topology(tmp_path / "t.yaml")
        kind = [msg for _, field, msg in exc.value.problems if field == "kind"]
        assert kind and "leaf-spine, fat-tree, rail-optimized" in kind[0]
        assert not [field for _, field, msg in exc.value.problems if "missing" in msg and field != "kind"]


# --------------------------------------------------------------------------- rail-optimized
def test_rail_nic_r_is_on_rail_leaf_r_of_its_group():
    p = rail(groups=2, servers=3, nics=4, spines=3)
    assert len(p.hosts) == 24 and len(p.leaves) == 8 and len(p.spines) == 3
    for h in p.hosts:
        server, nic = map(int, re.fullmatch(r"srv(\d+)n(\d+)", h.name).groups())
        group = (server - 1) // 3 + 1
        assert h.leaf == f"g{group}rail{nic}"
        assert h.leaf_port == (server - 1) % 3 + 1
    for leaf in p.leaves:
        assert [x.peer for x in p.uplinks(leaf.name)] == ["spine1", "spine2", "spine3"]
    for spine in p.spines:
        assert [x.peer for x in p.ports(spine.name)] == [s.name for s in p.leaves]
    assert_unique_and_valid(p)
    assert p.tier_oversubscription() == {"leaf": 1.0}


def test_rail_paths():
    p = rail()
    assert p.paths("srv1n1", "srv2n1") == [["srv1n1", "g1rail1", "srv2n1"]]  # same rail, same group
    assert len(p.paths("srv1n1", "srv1n2")) == 2  # another rail: through either spine
    assert len(p.paths("srv1n1", "srv3n1")) == 2  # another group


def test_rail_largest_spec_names_fit_linux():
    p = rail(groups=16, servers=64, nics=8, spines=64)
    assert max(len(x.intf) for sw in p.switches for x in p.ports(sw.name)) <= 15
    assert len({h.ip for h in p.hosts}) == 16 * 64 * 8


@pytest.mark.parametrize("field, value", [("nics_per_server", 0), ("nics_per_server", 9), ("groups", 17),
                                          ("servers_per_group", 0), ("spines", 0)])
def test_rail_bad_counts_are_input_errors(tmp_path, field, value):
    base = {"groups": 2, "servers_per_group": 2, "nics_per_server": 2, "spines": 2, field: value}
    (tmp_path / "t.yaml").write_text("name: t\nkind: rail-optimized\n" + "".join(f"{k}: {v}\n" for k, v in base.items()))
    with pytest.raises(SpecError) as exc:
        load_topology(tmp_path / "t.yaml")
    assert [p[1] for p in exc.value.problems] == [field]


# --------------------------------------------------------------------------- experiments
def _experiment(tmp_path: Path, topology: str, extra: str = "") -> Path:
    (tmp_path / "e.yaml").write_text(f"name: e\ntopology: {topology}\n"
                                     f"workload: {{type: allreduce, size: 1MB}}\n{extra}")
    return tmp_path / "e.yaml"


@pytest.mark.parametrize("extra, field", [
    ("load_balancing: spray\n", "load_balancing"),
    ("load_balancing: dlb\n", "load_balancing"),
    ("events: [{at: 1us, load_balancing: spray}]\n", "events.0.load_balancing"),
    ("events: [{at: 1us, link: edge1-core1, state: down}]\n", "events.0.link"),
])
def test_spray_dlb_and_missing_links_are_input_errors_on_a_fat_tree(tmp_path, extra, field):
    path = _experiment(tmp_path, "{name: t, kind: fat-tree, k: 4}", extra)
    with pytest.raises(SpecError) as exc:
        load_checked(path, [])  # a fat-tree's links are the plan's to know
    (f, fld, msg), = exc.value.problems
    assert fld == field and "\n" not in msg


def test_link_events_take_fat_tree_and_rail_links(tmp_path):
    spec = load_experiment(_experiment(tmp_path, "{name: t, kind: fat-tree, k: 4}",
                                       "events: [{at: 1us, link: agg1-core2, state: down}]\n"))
    assert spec.events[0].link == "agg1-core2"
    spec = load_experiment(_experiment(tmp_path, "{name: t, kind: rail-optimized, groups: 2, servers_per_group: 2,"
                                       " nics_per_server: 2, spines: 2}",
                                       "events: [{at: 1us, link: g2rail1-spine2, state: down}]\n"))
    assert spec.topology.host_count == 8


@pytest.mark.parametrize("topology, link", [
    ("{name: t, kind: fat-tree, k: 4}", "agg1-core3"),  # agg1 links core1 and core2
    ("{name: t, kind: fat-tree, k: 4}", "edge1-agg3"),  # two pods
    ("{name: t, kind: rail-optimized, groups: 2, servers_per_group: 2, nics_per_server: 2, spines: 2}",
     "g1rail1-spine3"),
])
def test_link_events_between_unlinked_switches_are_input_errors_of_the_plan(tmp_path, topology, link):
    """The spec leaves a fat-tree's or rail fabric's links to the plan, which knows them."""
    path = _experiment(tmp_path, topology, f"events: [{{at: 1us, link: {link}, state: down}}]\n")
    load_experiment(path)
    with pytest.raises(SpecError) as exc:
        load_checked(path, [])
    (f, fld, msg), = exc.value.problems
    assert (f, fld) == (str(path), "events.0.link")
    assert msg.startswith(f"{link} is not a link between two switches of this fabric (see fabric-emu show; as ")


def test_set_overrides_reach_the_new_kinds():
    spec = load_experiment(REPO / "experiments" / "quickstart-fat-tree.yaml", ["topology.k=6"])
    assert spec.topology.k == 6 and build_plan(spec.topology).hosts[-1].name == "h54"


@pytest.mark.parametrize("name", ["quickstart-fat-tree", "quickstart-rail"])
def test_shipped_experiments_plan_and_round_trip(name):
    spec = load_experiment(REPO / "experiments" / f"{name}.yaml")
    p = build_plan(spec.topology)
    again = FabricPlan.from_dict(json.loads(p.to_json()))
    assert again.to_dict() == p.to_dict() and again.tier_oversubscription() == p.tier_oversubscription()
