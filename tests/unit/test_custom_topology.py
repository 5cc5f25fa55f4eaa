"""kind: custom: explicit switches, hosts and links. The plan (roles, dpids, ports, addresses,
per-link rates, equal-cost paths), its JSON round trip, the controller's routes over it, every
input error (one line naming the field, through the loader the CLI uses) and `fabric-emu show`."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console
from ruamel.yaml import YAML

from controller.core import FabricCore, Group
from fabric_emu.lb import spray
from fabric_emu.ports.layout import MAX_PORTS
from fabric_emu.run.prepare import load_checked
from fabric_emu.run.show import print_plan
from fabric_emu.spec.errors import SpecError
from fabric_emu.spec.load import load_experiment, load_topology
from fabric_emu.spec.topology import MAX_LINK_ENDS, SWITCH_PORT_RE, CustomSpec
from fabric_emu.topo.plan import FabricPlan, Host, build_plan
from tests.unit.test_cli_input_errors import fabric_emu
from tests.unit.test_controller_core import _paths

REPO = Path(__file__).resolve().parents[2]
RING4 = REPO / "topologies" / "ring4.yaml"
_yaml = YAML(typ="safe", pure=True)


def ring4(**kw) -> FabricPlan:
    return build_plan(load_topology(RING4, [f"{k}={v}" for k, v in kw.items()]))


def custom(switches, hosts, links, **kw) -> FabricPlan:
    """A plan from short forms: hosts as (name, switch[, gbps]), links as (a, b[, gbps])."""
    return build_plan(CustomSpec(
        name="c", kind="custom", switches=switches,
        hosts=[dict(zip(("name", "switch", "gbps"), h)) for h in hosts],
        links=[dict(zip(("a", "b", "gbps"), ln)) for ln in links], **kw))


# A textbook figure with spines and a leaf that carries transit: b reaches c only through a.
#        x     y
#       / \   / \
#      b   a     c
FIGURE = (["x", "y", "a", "b", "c"], [("ha", "a"), ("hb", "b"), ("hc", "c", 25)],
          [("a", "x"), ("a", "y"), ("b", "x"), ("c", "y", 400)])


def _show(p: FabricPlan) -> str:
    out = Console(width=200, record=True, file=io.StringIO())
    print_plan(out, p, None, None)
    return out.export_text()


# --------------------------------------------------------------------------- the plan
def test_ring4_roles_dpids_ports_and_addresses():
    p = ring4()
    assert [(s.name, s.role, s.index, s.dpid) for s in p.switches] == [
        ("r1", "leaf", 1, 0x7001), ("r2", "leaf", 2, 0x7002), ("r3", "leaf", 3, 0x7003), ("r4", "leaf", 4, 0x7004)]
    assert [(h.name, h.leaf, h.leaf_port, h.ip, h.intf) for h in p.hosts] == [
        (f"h{n}", f"r{n}", 1, f"10.0.{n}.1", f"h{n}-eth0") for n in range(1, 5)]
    # port 1 the host, then the links in the order listed: r1-r2, r2-r3, r3-r4, r4-r1
    assert {s.name: [(x.port, x.peer) for x in p.ports(s.name)] for s in p.switches} == {
        "r1": [(1, "h1"), (2, "r2"), (3, "r4")], "r2": [(1, "h2"), (2, "r1"), (3, "r3")],
        "r3": [(1, "h3"), (2, "r2"), (3, "r4")], "r4": [(1, "h4"), (2, "r3"), (3, "r1")]}
    assert all(re.match(SWITCH_PORT_RE, x.intf) for s in p.switches for x in p.ports(s.name))
    assert p.kind == "custom" and len({h.mac for h in p.hosts}) == 4


def test_ring4_paths():
    p = ring4()
    assert p.paths("h1", "h3") == [["h1", "r1", "r2", "r3", "h3"], ["h1", "r1", "r4", "r3", "h3"]]
    assert p.paths("h1", "h2") == [["h1", "r1", "r2", "h2"]]
    assert len(p.paths("h2", "h4")) == 2


def test_per_link_rates_and_defaults():
    p = custom(*FIGURE, host_link={"gbps": 50}, fabric_link={"gbps": 200}, dilation=1000)
    rate = {frozenset((ln.a, ln.b)): (ln.gbps, ln.emulated_bps) for ln in p.links}
    assert rate[frozenset(("ha", "a"))] == (50, 50e6)  # host_link's
    assert rate[frozenset(("hc", "c"))] == (25, 25e6)  # its own
    assert rate[frozenset(("a", "x"))] == (200, 200e6)  # fabric_link's
    assert rate[frozenset(("c", "y"))] == (400, 400e6)  # its own
    assert p.host_rate_bps("hc") == 25e6


def test_switches_without_hosts_are_spines_and_leaves_are_numbered_in_order():
    p = custom(*FIGURE)
    assert [(s.name, s.role, s.index, s.dpid) for s in p.switches] == [
        ("x", "spine", 1, 0x7001), ("y", "spine", 2, 0x7002), ("a", "leaf", 1, 0x7003),
        ("b", "leaf", 2, 0x7004), ("c", "leaf", 3, 0x7005)]
    assert [h.ip for h in p.hosts] == ["10.0.1.1", "10.0.2.1", "10.0.3.1"]
    assert p.paths("hb", "hc") == [["hb", "b", "x", "a", "y", "c", "hc"]]  # through leaf a
    # hosts 100 + 100 + 25 Gb/s over links 100 + 100 + 100 + 400 Gb/s up to the spines
    assert p.tier_oversubscription() == {"leaf": pytest.approx(225 / 700)}


def test_several_hosts_on_a_switch_take_ports_in_the_listed_order():
    p = custom(["s1", "s2"], [("h1", "s1"), ("h3", "s2"), ("h2", "s1")], [("s1", "s2")])
    assert [(h.name, h.leaf_port, h.ip) for h in p.hosts] == [
        ("h1", 1, "10.0.1.1"), ("h3", 1, "10.0.2.1"), ("h2", 2, "10.0.1.2")]
    assert [(x.port, x.peer) for x in p.ports("s1")] == [(1, "h1"), (2, "h2"), (3, "s2")]
    assert p.oversubscription == 2.0 and p.leaf_oversubscription() == {"s1": 2.0, "s2": 1.0}


def test_one_switch_fabric_has_no_uplinks_and_does_not_crash():
    p = custom(["s"], [("h1", "s"), ("h2", "s")], [])
    assert p.oversubscription == 0.0 and p.tier_oversubscription() == {}
    assert p.paths("h1", "h2") == [["h1", "s", "h2"]]
    assert spray.plan_entropies([len(p.uplinks(leaf.name)) for leaf in p.leaves], None) == 1  # the lab's
    assert "oversubscription none (one switch)" in _show(p)


def test_a_ring_has_no_tiers_and_its_leaves_are_half_oversubscribed():
    p = ring4()
    assert p.tier_oversubscription() == {} and p.oversubscription == 0.5
    assert "oversubscription 0.5:1 at the leaves" in _show(p)


def test_show_gives_the_range_of_link_rates():
    text = _show(custom(*FIGURE))
    assert "host links 25Gbps-100Gbps modelled / 12.5Mbps-50Mbps emulated" in text
    assert "fabric links 100Gbps-400Gbps / 50Mbps-200Mbps" in text
    assert "oversubscription 0.0625:1 to 1:1 at the leaves" in text  # c: 25 over 400 Gb/s; b: 100 over 100
    assert "b    │ c  │ 1: x>a>y" in text  # through leaf a


@pytest.mark.parametrize("make", [ring4, lambda: custom(*FIGURE)], ids=["ring4", "figure"])
def test_json_round_trip(make):
    p = make()
    again = FabricPlan.from_dict(json.loads(p.to_json()))
    assert again.to_dict() == p.to_dict() and again == p
    assert again.paths("h1" if "h1" in p.host_by_name else "hb", p.hosts[-1].name)


def test_longest_names_fit_linux():
    names = [f"s{i:09d}" for i in range(3)]  # 10 characters, 3 ports each: s000000000-eth3
    p = custom(names, [("hostname01", names[0]), ("hostname02", names[2])],
               [(names[0], names[1]), (names[1], names[2]), (names[2], names[0])])
    assert max(len(x.intf) for s in p.switches for x in p.ports(s.name)) == 15
    assert p.host_by_name["hostname01"].intf == "hostname01-eth0"


# --------------------------------------------------------------------------- the controller
def _walk(plan: FabricPlan, core: FabricCore, src: Host, dst: Host) -> list[list[str]]:
    """Every node sequence a UDP packet from src to dst can take (a custom fabric's paths may
    cross every switch)."""
    return _paths(plan, core, src, dst, longest=len(plan.switches) + 2)


@pytest.mark.parametrize("make", [ring4, lambda: custom(*FIGURE)], ids=["ring4", "figure"])
def test_the_controller_routes_every_host_pair_by_every_equal_cost_path(make):
    p = make()
    core = FabricCore(p)
    for src in p.hosts:
        for dst in p.hosts:
            if src is not dst:
                assert sorted(_walk(p, core, src, dst)) == p.paths(src.name, dst.name)


def test_the_ring_spreads_opposite_leaves_over_a_group():
    p = ring4()
    msgs = FabricCore(p).switch_up(p.switch_by_name["r1"].dpid)
    (group,) = [m for m in msgs if isinstance(m, Group)]  # toward r3, both ways round
    assert sorted(b.actions[0].port for b in group.buckets) == [2, 3]


# --------------------------------------------------------------------------- input errors
def _bad(tmp_path: Path, change) -> list[tuple[str, str, str]]:
    data = _yaml.load(RING4.read_text())
    change(data)
    path = tmp_path / "t.yaml"
    with path.open("w") as f:
        _yaml.dump(data, f)
    with pytest.raises(SpecError) as exc:
        load_topology(path)
    for f, _, msg in exc.value.problems:
        assert f == str(path) and "\n" not in msg
    return [(field, msg) for _, field, msg in exc.value.problems]


def _host(name, switch, **kw):
    return {"name": name, "switch": switch, **kw}


BAD = {
    "unknown switch of a link": (lambda d: d["links"][2].update(b="r9"),
                                 "links.2.b", "unknown switch 'r9' (switches are r1, r2, r3, r4)"),
    "unknown switch of a host": (lambda d: d["hosts"][1].update(switch="r9"),
                                 "hosts.1.switch", "unknown switch 'r9'"),
    "link to itself": (lambda d: d["links"].append({"a": "r2", "b": "r2"}), "links.4.b", "a link from r2 to itself"),
    "duplicate link": (lambda d: d["links"].append({"a": "r2", "b": "r1"}),
                       "links.4", "r2-r1 is already links.0 (a custom fabric has at most one link"),
    "duplicate link, same order": (lambda d: d["links"].append({"a": "r3", "b": "r4", "gbps": 200}),
                                   "links.4", "r3-r4 is already links.2"),
    "switch listed twice": (lambda d: d["switches"].append("r2"), "switches.4", "'r2' is listed twice (switches.1)"),
    "host named like a switch": (lambda d: d["hosts"].append(_host("r3", "r1")),
                                 "hosts.4.name", "'r3' is already the name of a switch (switches.2)"),
    "host named twice": (lambda d: d["hosts"].append(_host("h2", "r1")),
                         "hosts.4.name", "'h2' is already the name of another host (hosts.1.name)"),
    "upper-case name": (lambda d: d["switches"].__setitem__(0, "R1"),
                        "switches.0", "got 'R1' (1-10 lower-case letters and digits, starting with a letter)"),
    "dash in a name": (lambda d: d["hosts"][0].update(name="h-1"), "hosts.0.name", "got 'h-1' (1-10 lower-case"),
    "name too long": (lambda d: d["switches"].append("abcdefghijk"), "switches.4", "got 'abcdefghijk'"),
    "disconnected host": (lambda d: d.update(links=[{"a": "r1", "b": "r2"}, {"a": "r3", "b": "r4"}]),
                          "hosts.2.switch", "h3 cannot reach h1: no links join r3 to r1 (nor can h4)"),
    "disconnected switch": (lambda d: d["switches"].append("r5"),
                            "switches.4", "r5 is not linked to the hosts' switches"),
    "one host": (lambda d: d.update(hosts=[_host("h1", "r1")]), "hosts", "at least 2 items"),
    "no switches": (lambda d: d.update(switches=[]), "switches", "at least 1 item"),
    "zero rate": (lambda d: d["links"][0].update(gbps=0), "links.0.gbps", "greater than 0"),
    "host rate too high": (lambda d: d["hosts"][0].update(gbps=3200), "hosts.0.gbps", "less than or equal to 1600"),
    "unknown key": (lambda d: d["links"][0].update(rate=5), "links.0.rate", "unknown key"),
    "leaf-spine key": (lambda d: d.update(spines=2), "spines", "unknown key"),
    "too many ports": (lambda d: d.update(switches=["s"], links=[],
                                          hosts=[_host(f"h{i}", "s") for i in range(251)]),
                       "switches.0", "s has 251 ports (hosts and links); at most 250"),
    "interface names too long": (lambda d: d.update(switches=["abcdefghij"], links=[],
                                                    hosts=[_host(f"h{i}", "abcdefghij") for i in range(10)]),
                                 "switches.0", "interface names like abcdefghij-eth10 are longer than Linux's "
                                               "15 characters; give it a name of at most 9 characters"),
    "too many leaves": (lambda d: d.update(switches=[f"s{i}" for i in range(201)],
                                           hosts=[_host(f"h{i}", f"s{i}") for i in range(201)],
                                           links=[{"a": "s0", "b": f"s{i}"} for i in range(1, 201)]),
                        "hosts", "hosts are on 201 switches; at most 200"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_custom_topologies_are_one_line_naming_the_field(tmp_path, case):
    change, field, expected = BAD[case]
    (got_field, msg), = _bad(tmp_path, change)
    assert got_field == field and expected in msg, (got_field, msg)


def test_too_many_link_ends_for_the_port_datapath(tmp_path):
    switches = [f"s{i}" for i in range(40)]
    hosts = [_host(f"h{i}", switches[i % 40]) for i in range(1300)]
    links = [{"a": a, "b": b} for i, a in enumerate(switches) for b in switches[i + 1:]]  # 780
    (field, msg), = _bad(tmp_path, lambda d: d.update(switches=switches, hosts=hosts, links=links))
    assert (field, msg) == ("links", "1300 hosts and 780 links have 4160 link ends; the port datapath holds 4095")
    assert MAX_LINK_ENDS == MAX_PORTS - 1


def test_unknown_kind_names_custom_among_the_kinds(tmp_path):
    problems = _bad(tmp_path, lambda d: d.update(kind="torus"))
    assert ("kind", "got 'torus' (allowed: leaf-spine, fat-tree, rail-optimized, custom)") in problems


# --------------------------------------------------------------------------- experiments
def _experiment(tmp_path: Path, extra: str = "") -> Path:
    (tmp_path / "e.yaml").write_text(f"name: e\ntopology: {RING4}\nworkload: {{type: allreduce, size: 1MB}}\n{extra}")
    return tmp_path / "e.yaml"


def test_an_experiment_on_ring4_checks_with_its_plan(tmp_path):
    spec, plan, ranks = load_checked(_experiment(tmp_path, "events: [{at: 1us, link: r2-r1, state: down}]\n"
                                                           "capture: {ports: [r1-eth2]}\n"), [])
    assert ranks == ["h1", "h2", "h3", "h4"] and spec.topology.host_count == 4 and plan.kind == "custom"


@pytest.mark.parametrize("extra, field, expected", [
    ("events: [{at: 1us, link: r1-r3, state: down}]\n", "events.0.link",
     "r1-r3 is not a link between two switches of this fabric"),
    ("events: [{at: 1us, link: r1-r9, gbps: 25}]\n", "events.0.link", "r1-r9 is not a link"),
    ("capture: {ports: [r1-eth4]}\n", "capture.ports.0", "no switch port 'r1-eth4' in this fabric"),
    ("load_balancing: spray\n", "load_balancing", "spray runs on leaf-spine fabrics only; this one is custom"),
    ("workload: {type: allreduce, size: 1MB, ranks: [h1, h5]}\n", "workload.ranks", "unknown host 'h5'"),
])
def test_names_only_the_plan_knows_are_input_errors(tmp_path, extra, field, expected):
    path = _experiment(tmp_path, extra)
    if extra.startswith("workload"):
        path.write_text(f"name: e\ntopology: {RING4}\n{extra}")
    with pytest.raises(SpecError) as exc:
        load_checked(path, [])
    (f, fld, msg), = exc.value.problems
    assert (f, fld) == (str(path), field) and expected in msg


def test_errors_in_an_experiment_name_the_topology_file(tmp_path):
    with pytest.raises(SpecError) as exc:
        load_experiment(_experiment(tmp_path), ["topology.links=[{a: r1, b: r9}]"])
    assert exc.value.problems == [(str(RING4), "links.0.b", "unknown switch 'r9' (switches are r1, r2, r3, r4)")]


def test_pfc_headroom_is_sized_for_the_fastest_link(tmp_path):
    path = _experiment(tmp_path)
    spec = load_experiment(path, ["topology.links=[{a: r1, b: r2, gbps: 400}, {a: r2, b: r3}, {a: r3, b: r4}]"])
    assert spec.topology.fastest_link_gbps == 400
    assert spec.pfc.headroom > load_experiment(path).pfc.headroom


# --------------------------------------------------------------------------- the CLI
def test_show_prints_a_custom_fabric():
    r = fabric_emu(["show", str(RING4)], REPO)
    assert r.returncode == 0, r.stderr
    assert "ring4 (custom): 4 leaves, 4 hosts" in r.stdout and "0x7004" in r.stdout and "10.0.3.1" in r.stdout
    assert "2: r2, r4" in r.stdout  # r1 to r3, both ways round


def test_show_runs_an_experiment_on_ring4_and_rejects_a_bad_one(tmp_path):
    r = fabric_emu(["show", str(_experiment(tmp_path))], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "allreduce ring" in r.stdout
    (tmp_path / "t.yaml").write_text(RING4.read_text().replace("{a: r3, b: r4}", "{a: r3, b: r9}"))
    r = fabric_emu(["show", str(tmp_path / "t.yaml")], tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip() == (f"error: {tmp_path / 't.yaml'}: links.2.b: unknown switch 'r9'"
                                " (switches are r1, r2, r3, r4)")
