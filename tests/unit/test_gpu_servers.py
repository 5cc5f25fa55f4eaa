"""Multi-GPU servers (issue 22): the `servers:` spec and plan.servers, which transfers go across a
server's scale-up domain, the hierarchical all-reduce's bytes, topology-aware placement on
servers, and PXN's relay on rail-optimized fabrics."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabric_emu.nic.scale_up import ScaleUpChannels
from fabric_emu.run.prepare import load_checked
from fabric_emu.spec.errors import SpecError
from fabric_emu.spec.load import load_experiment
from fabric_emu.spec.topology import FatTreeSpec, LeafSpineSpec, RailOptimizedSpec
from fabric_emu.topo.plan import FabricPlan, build_plan
from fabric_emu.workloads import collectives, jobs, training
from fabric_emu.workloads.program import FABRIC, RECV, SCALE_UP, SEND, Domains, Program
from tests.unit import program_sim

REPO = Path(__file__).resolve().parents[2]
SERVERS = {"gpus": 4, "scale_up": {"gbps": 3600, "latency": "1us"}}


def leaf_spine(servers=SERVERS, leaves=2, hosts=8) -> FabricPlan:
    return build_plan(LeafSpineSpec(name="ls", kind="leaf-spine", spines=2, leaves=leaves, hosts_per_leaf=hosts,
                                    servers=servers))


def rail(servers=2, nics=2, groups=1) -> FabricPlan:
    return build_plan(RailOptimizedSpec(name="r", kind="rail-optimized", groups=groups, servers_per_group=servers,
                                        nics_per_server=nics, spines=2, servers={}))


def domains(plan: FabricPlan, pxn: bool = True) -> Domains:
    return Domains({s.name: s.hosts for s in plan.servers}, pxn=pxn and plan.kind == "rail-optimized")


def simulate(p: Program, plan: FabricPlan):
    """The program on program_sim's fake wire (1 GB/s) with the engines' scale-up domains (36x)."""
    return program_sim.run(p, servers=[ScaleUpChannels(s.name, s.hosts, 36e9, 1e-6) for s in plan.servers])


# --------------------------------------------------------------------------- spec and plan

def test_leaf_spine_servers_are_consecutive_hosts_under_one_leaf():
    p = leaf_spine()
    assert [s.name for s in p.servers] == ["srv1", "srv2", "srv3", "srv4"]
    assert p.servers[1].hosts == ("h5", "h6", "h7", "h8")
    assert (p.servers[0].gbps, p.servers[0].latency_s) == (3600, 1e-6)
    for srv in p.servers:
        assert len({p.host_by_name[h].leaf for h in srv.hosts}) == 1
    assert p.same_server("h5", "h8") and not p.same_server("h4", "h5")
    assert [h.name for h in p.hosts] == [f"h{i}" for i in range(1, 17)]  # names unchanged
    assert FabricPlan.from_dict(p.to_dict()).servers == p.servers


def test_fat_tree_servers_sit_under_one_edge():
    p = build_plan(FatTreeSpec(name="ft", kind="fat-tree", k=4, servers={"gpus": 2}))
    assert len(p.servers) == 8
    assert all(len({p.host_by_name[h].leaf for h in s.hosts}) == 1 for s in p.servers)


def test_rail_servers_put_gpu_r_on_rail_r():
    p = rail(servers=2, nics=2, groups=2)
    assert [s.hosts for s in p.servers] == [("srv1n1", "srv1n2"), ("srv2n1", "srv2n2"),
                                            ("srv3n1", "srv3n2"), ("srv4n1", "srv4n2")]
    for s in p.servers:
        assert [p.host_by_name[h].leaf[-5:] for h in s.hosts] == ["rail1", "rail2"]
    # without `servers:` a rail fabric's NICs reach each other only through the fabric, as before
    assert build_plan(RailOptimizedSpec(name="r", kind="rail-optimized", groups=1, servers_per_group=2,
                                        nics_per_server=2, spines=1)).servers == []


TOPOS = {
    "ls": "kind: leaf-spine\nspines: 2\nleaves: 2\nhosts_per_leaf: 6\n",
    "rail": "kind: rail-optimized\ngroups: 1\nservers_per_group: 2\nnics_per_server: 2\nspines: 2\n",
    "custom": "kind: custom\nswitches: [s1]\nhosts: [{name: a, switch: s1}, {name: b, switch: s1}]\n",
}


@pytest.mark.parametrize("topo,servers,field,words", [
    ("ls", "{gpus: 4}", "topology.servers.gpus", "does not divide hosts_per_leaf (6)"),
    ("ls", "{scale_up: {gbps: 900}}", "topology.servers.gpus", "required"),
    ("ls", "{gpus: 3, scale_up: {latency: soon}}", "topology.servers.scale_up.latency", "'soon'"),
    ("ls", "{gpus: 3, nvlink: true}", "topology.servers.nvlink", "unknown key"),
    ("rail", "{gpus: 4}", "topology.servers.gpus", "is not nics_per_server (2)"),
    ("custom", "{gpus: 2}", "topology.servers", "single-NIC hosts"),
])
def test_bad_servers_are_one_problem_at_their_field(tmp_path: Path, topo, servers, field, words):
    (tmp_path / "e.yaml").write_text(
        "name: e\ntopology:\n  name: t\n" + "".join(f"  {ln}\n" for ln in TOPOS[topo].splitlines())
        + f"  servers: {servers}\nworkload: {{type: alltoall, size: 1MB}}\n")
    with pytest.raises(SpecError) as exc:
        load_experiment(tmp_path / "e.yaml")
    (f, fld, msg), = exc.value.problems
    assert f.endswith("e.yaml") and fld == field and words in msg and "\n" not in msg, (fld, msg)


def test_hierarchical_needs_servers_and_is_the_default_with_them(tmp_path: Path):
    body = "name: e\ntopology:\n  name: t\n  kind: leaf-spine\n  spines: 1\n  leaves: 2\n  hosts_per_leaf: 4\n"
    (tmp_path / "a.yaml").write_text(body + "workload: {type: allreduce, algorithm: hierarchical, size: 1MB}\n")
    with pytest.raises(SpecError) as exc:
        load_experiment(tmp_path / "a.yaml")
    (_, fld, msg), = exc.value.problems
    assert fld == "workload.algorithm" and "topology.servers" in msg
    (tmp_path / "b.yaml").write_text(body + "workload: {type: allreduce, size: 1MB}\n")
    plain = load_experiment(tmp_path / "b.yaml")
    assert plain.workload.algorithm == "ring" and not jobs.uses_program(plain)  # the ring driver, as before
    (tmp_path / "c.yaml").write_text(body + "  servers: {gpus: 2}\nworkloads: [{type: allreduce, size: 1MB}]\n")
    spec = load_experiment(tmp_path / "c.yaml")
    assert spec.workloads[0].algorithm == "hierarchical"
    ring = spec.model_copy(update={"workload": spec.workloads[0].model_copy(update={"algorithm": "ring"}),
                                   "workloads": []})
    assert jobs.uses_program(ring)  # a ring over servers runs as a Program: some hops are scale-up


# --------------------------------------------------------------------------- which path a transfer takes

def test_transfers_inside_a_server_are_scale_up_the_others_fabric():
    p = Program(domains=domains(leaf_spine()))
    p.transfer("j", "x", "h1", "h4", 100)
    p.transfer("j", "x", "h4", "h5", 100)
    p.transfer("j", "x", "h1", "h2", 100, via=FABRIC)  # an explicit path is kept
    assert [(c.src, c.dst, c.via) for c in p.channels] == [
        ("h1", "h4", SCALE_UP), ("h4", "h5", FABRIC), ("h1", "h2", FABRIC)]
    # leaf-spine servers share one leaf: PXN never applies
    p.transfer("j", "x", "h1", "h6", 100)
    assert p.channels[-1].via == FABRIC and len(p.channels) == 4


def test_pxn_relays_cross_rail_traffic_through_the_destination_rails_gpu():
    p = Program(domains=domains(rail()))
    s, r = p.transfer("j", "a2a", "srv1n1", "srv2n2", 1000, cat="alltoall")
    hop1, hop2 = p.channels
    assert (hop1.src, hop1.dst, hop1.via, hop1.relay) == ("srv1n1", "srv1n2", SCALE_UP, False)
    assert (hop2.src, hop2.dst, hop2.via, hop2.relay) == ("srv1n2", "srv2n2", FABRIC, True)
    send, relay_recv, relay_send, recv = p.ops
    assert (send.id, recv.id) == (s, r) and send.host == "srv1n1" and recv.host == "srv2n2"
    assert relay_recv.kind == RECV and relay_send.kind == SEND and relay_send.host == "srv1n2"
    assert relay_send.deps == [relay_recv.id]  # the relay forwards what it has received
    assert all(o.nbytes == 1000 and o.cat == "alltoall" for o in p.ops)
    # same rail, or same server: no relay
    p.transfer("j", "a2a", "srv1n2", "srv2n2", 10)
    p.transfer("j", "a2a", "srv1n1", "srv1n2", 10)
    assert [(c.src, c.dst, c.via) for c in p.channels[2:]] == [
        ("srv1n2", "srv2n2", FABRIC), ("srv1n1", "srv1n2", SCALE_UP)]
    assert p.sent_by_via() == {FABRIC: 1010, SCALE_UP: 1010}


def test_without_pxn_cross_rail_traffic_goes_straight_across_the_fabric():
    p = Program(domains=domains(rail(), pxn=False))
    p.transfer("j", "a2a", "srv1n1", "srv2n2", 1000)
    assert [(c.src, c.dst, c.via) for c in p.channels] == [("srv1n1", "srv2n2", FABRIC)]


def test_pxn_keeps_each_pairs_messages_in_order_and_never_deadlocks():
    """An all-to-all of 3 servers x 2 GPUs, twice: every cross-rail pair through its own relay
    channels, in its order; the run completes and every message arrives."""
    plan = rail(servers=3, nics=2)
    p = Program(domains=domains(plan))
    hosts = [h.name for h in plan.hosts]
    collectives.collective_program("j", "alltoall", "pairwise", hosts, 6000, iterations=2, p=p)
    p.check()
    relays = [c for c in p.channels if c.relay]
    # 3 servers x 2 GPUs: each GPU has 2 cross-rail peers on other servers
    assert len(relays) == 6 * 2
    for c in relays:
        assert plan.host_by_name[c.src].leaf == plan.host_by_name[c.dst].leaf  # one rail
    runners, _, _ = simulate(p, plan)
    assert all(r.finished for r in runners.values())


# --------------------------------------------------------------------------- hierarchical all-reduce

@pytest.mark.parametrize("size", [1_000_000, 999_983])
def test_hierarchical_allreduce_bytes(size):
    """k GPUs x m servers: each rank sends 2(k-1)/k S inside its server and 2(m-1)/m S/k on the
    fabric, 2(n-1)/n S in all (a flat ring's, so nccl-tests' busbw factor holds)."""
    plan = leaf_spine()
    hosts = [h.name for h in plan.hosts]
    p = Program(domains=domains(plan))
    collectives.collective_program("j", "allreduce", "hierarchical", hosts, size, p=p)
    p.check()
    k, m, n = 4, 4, 16
    for h in hosts:
        sent = {FABRIC: 0, SCALE_UP: 0}
        for o in p.ops:
            if o.kind == SEND and o.host == h:
                sent[p.channels[o.channel].via] += o.nbytes
        assert sent[SCALE_UP] == pytest.approx(2 * (k - 1) / k * size, abs=2 * k)
        assert sent[FABRIC] == pytest.approx(2 * (m - 1) / m * size / k, abs=2 * m)
    total = sum(o.nbytes for o in p.ops if o.kind == SEND)
    assert total == pytest.approx(collectives.bytes_per_rank("allreduce", size, n) * n, abs=4 * n * k)
    # the fabric rings join GPUs of one index: h1, h5, h9, h13 ...
    fabric = {(c.src, c.dst) for c in p.channels if c.via == FABRIC}
    assert ("h1", "h5") in fabric and ("h13", "h1") in fabric and not any(
        (int(a[1:]) - int(b[1:])) % 4 for a, b in fabric)
    runners, _, _ = simulate(p, plan)
    assert all(r.finished for r in runners.values())


def test_hierarchical_is_a_plain_ring_without_servers_or_uneven_ranks():
    hosts = [f"h{i}" for i in range(1, 9)]
    ring = collectives.collective_program("j", "allreduce", "ring", hosts, 80_000)
    plain = collectives.collective_program("j", "allreduce", "hierarchical", hosts, 80_000)
    assert plain.channels == ring.channels and [o.nbytes for o in plain.ops] == [o.nbytes for o in ring.ops]
    # three ranks on srv1, one on srv2: a ring, its srv1 hops scale-up
    p = Program(domains=domains(leaf_spine()))
    collectives.collective_program("j", "allreduce", "hierarchical", ["h1", "h2", "h3", "h5"], 80_000, p=p)
    assert [(c.src, c.dst, c.via) for c in p.channels] == [
        ("h1", "h2", SCALE_UP), ("h2", "h3", SCALE_UP), ("h3", "h5", FABRIC), ("h5", "h1", FABRIC)]


# --------------------------------------------------------------------------- placement

def servers_of(plan: FabricPlan) -> list[list[str]]:
    return [list(s.hosts) for s in plan.servers]


def test_topology_aware_keeps_tp_in_servers_and_stages_on_other_servers():
    plan = leaf_spine()
    grid = training.place(4, 2, 2, "topology-aware", jobs.hosts_by_leaf(plan), servers_of(plan))
    srv = {h: s.name for s in plan.servers for h in s.hosts}
    for rep in grid:
        assert all(len({srv[h] for h in stage}) == 1 for stage in rep)  # TP inside a server
        assert len({srv[rep[s][0]] for s in range(2)}) == 2  # stages on different servers
    # the replicas on different servers, under different leaves
    leaf = {h.name: h.leaf for h in plan.hosts}
    assert leaf[grid[0][0][0]] != leaf[grid[1][0][0]]
    naive = training.place(4, 2, 2, "naive", jobs.hosts_by_leaf(plan), servers_of(plan))
    assert all(len({srv[h] for h in stage}) == 4 for rep in naive for stage in rep)  # TP split up


def test_smaller_tp_groups_fill_a_server_with_replicas_of_one_stage():
    plan = leaf_spine()
    grid = training.place(2, 2, 4, "topology-aware", jobs.hosts_by_leaf(plan), servers_of(plan))
    srv = {h: s.name for s in plan.servers for h in s.hosts}
    assert grid[0][0] == ["h1", "h2"] and grid[1][0] == ["h3", "h4"]  # replicas 0, 1 of stage 0: srv1
    assert grid[0][1] == ["h5", "h6"]  # stage 1 on the next server
    assert all(srv[rep[0][0]] != srv[rep[1][0]] for rep in grid)
    # tp larger than a server: whole servers under one leaf
    grid = training.place(8, 2, 1, "topology-aware", jobs.hosts_by_leaf(plan), servers_of(plan))
    assert grid[0][0] == [f"h{i}" for i in range(1, 9)]


def test_a_training_job_on_servers_sends_no_tp_bytes_over_the_fabric(tmp_path: Path):
    exp = REPO / "experiments" / "gpu-servers-3d.yaml"
    for placement, tp_fabric in (("topology-aware", False), ("naive", True)):
        spec, plan, _ = load_checked(exp, [f"workload.placement={placement}"])
        p = jobs.build_program(jobs.resolve_jobs(spec, plan))
        tp = [c for c in p.channels if c.stream == "tp"]
        assert tp and any(c.via == FABRIC for c in tp) == tp_fabric
        assert all(c.via == SCALE_UP for c in tp) != tp_fabric


def test_pxn_switch_in_the_experiment():
    exp = REPO / "experiments" / "rail-pxn.yaml"
    for pxn, relays in (("true", True), ("false", False)):
        spec, plan, ranks = load_checked(exp, [f"pxn={pxn}"])
        p = jobs.build_program(jobs.resolve_jobs(spec, plan))
        assert any(c.relay for c in p.channels) == relays
        assert set(ranks) == set(p.hosts)
        if relays:  # every fabric hop stays on one rail
            assert all(plan.host_by_name[c.src].leaf == plan.host_by_name[c.dst].leaf
                       for c in p.channels if c.via == FABRIC)


def test_topology_aware_steps_faster_on_the_engines_model():
    """gpu-servers-3d on program_sim (NIC links at 100 Gb/s without contention, the servers'
    domains at 3600 Gb/s): with its TP all-reduces inside servers the step is close to its
    compute (5 x 150 us of 1F1B; measured 901 us), naive's TP all-reduces at the NICs' rate
    make it 1,492 us."""
    ends = {}
    for placement in ("topology-aware", "naive"):
        spec, plan, _ = load_checked(REPO / "experiments" / "gpu-servers-3d.yaml",
                                     [f"workload.placement={placement}", "topology.dilation=1"])
        p = jobs.build_program(jobs.resolve_jobs(spec, plan))
        _, _, ends[placement] = program_sim.run(
            p, rate_Bps=100e9 / 8, latency_s=2e-6,
            servers=[ScaleUpChannels(s.name, s.hosts, s.gbps * 1e9 / 8, s.latency_s) for s in plan.servers])
    assert ends["topology-aware"] < 0.7 * ends["naive"], ends
