"""`dilation: auto`, the pure parts: planned packet rates, the choice, the capacity cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fabric_emu.measure import capacity
from fabric_emu.spec.errors import SpecError
from fabric_emu.spec.experiment import ExperimentSpec
from fabric_emu.spec.load import load_experiment
from fabric_emu.measure.dilation import (MAX_DILATION, Capacity, PlannedLoad, choose_dilation, explain,
                                 fair_rates, nice_numbers, planned_load, utilisation)
from fabric_emu.topo.plan import build_plan

TOPO = {"name": "t", "kind": "leaf-spine", "spines": 2, "leaves": 4, "hosts_per_leaf": 2, "dilation": "auto"}
FRAME = 4096 + 60 + 14  # RoCE path MTU + RoCE/IP headers + Ethernet at MTU 4200
PPS_100G = 100e9 / (FRAME * 8)  # full frames per second of one 100 Gb/s host link
ACKS = 1 + 1 / 16


def spec(workload: dict, **topo) -> ExperimentSpec:
    return ExperimentSpec.model_validate({"name": "e", "topology": {**TOPO, **topo}, "workload": workload})


def load(s: ExperimentSpec, ranks: list[str] | None = None) -> PlannedLoad:
    plan = build_plan(s.topology, dilation=1.0)
    return planned_load(s, plan, ranks or [h.name for h in plan.hosts])


def test_nice_numbers():
    assert list(nice_numbers(stop=1000)) == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]
    assert next(nice_numbers(start=1001)) == 2000


def test_fair_rates_share_the_host_links():
    links = {h: 10.0 for h in "abcr"}
    assert fair_rates([("a", "b"), ("b", "a")], links) == [10.0, 10.0]  # full duplex
    assert fair_rates([("a", "r"), ("b", "r"), ("c", "r")], links) == pytest.approx([10 / 3] * 3)
    # a's two flows share its link; b's flow into r gets what a's leaves of r's.
    assert fair_rates([("a", "r"), ("b", "r"), ("a", "c")], links) == pytest.approx([5, 5, 5])
    assert fair_rates([("a", "r"), ("b", "r")], {"a": 2.0, "b": 10.0, "r": 10.0}) == pytest.approx([2, 8])


def test_ring_allreduce_keeps_every_host_at_line_rate():
    planned = load(spec({"type": "allreduce", "size": "8MB"}))
    # 8 ranks in host order on 2 hosts per leaf: h1>h2 stays in its leaf (1 switch), h2>h3
    # crosses a spine (3 switches): 4 flows of each, every flow at the full 100 Gb/s.
    assert planned.frame_bytes == FRAME and planned.flows == 8
    assert planned.switch_pps == pytest.approx(PPS_100G * ACKS * (4 * 1 + 4 * 3))
    assert planned.nic_pps == pytest.approx(8 * 2 * PPS_100G * ACKS)
    assert set(planned.host_pps) == {f"h{i}" for i in range(1, 9)}
    assert all(v == pytest.approx(2 * PPS_100G * ACKS) for v in planned.host_pps.values())


def test_incast_senders_share_the_receivers_link():
    planned = load(spec({"type": "incast", "receiver": "h1", "senders": ["h2", "h3", "h5"], "size": "1MB"}),
                   ["h1", "h2", "h3", "h5"])
    # one link's worth of packets in all; h2 shares h1's leaf, h3 and h5 cross a spine
    assert planned.switch_pps == pytest.approx(PPS_100G / 3 * ACKS * (1 + 3 + 3))
    assert planned.host_pps["h1"] == pytest.approx(PPS_100G * ACKS)
    assert planned.nic_pps == pytest.approx(2 * PPS_100G * ACKS)


def test_ack_rate_follows_the_transport_spec_when_there_is_one():
    s = spec({"type": "allreduce", "size": "8MB"})
    if "transport" not in ExperimentSpec.model_fields:
        pytest.skip("no transport settings in this tree")
    s = s.model_copy(update={"transport": s.transport.model_copy(update={"ack_every": 1})})
    assert load(s).nic_pps == pytest.approx(8 * 2 * PPS_100G * 2)


CAP = Capacity(ovs_pps=100_000, nic_pps=300_000, cores=2, mtu=4200, ovs_wakeup_s=100e-6)


def test_choose_the_lowest_nice_dilation_within_the_margin():
    planned = load(spec({"type": "allreduce", "size": "8MB"}))
    d = choose_dilation(planned, CAP)
    assert d in set(nice_numbers())
    assert max(utilisation(planned, CAP, d).values()) <= 0.5
    lower = max(x for x in nice_numbers(stop=d - 1))
    assert max(utilisation(planned, CAP, lower).values()) > 0.5
    # Here OVS limits: 51.0M frame-hops/s modelled over 50k/s (half of 100k/s) is 1020 -> 2000.
    assert utilisation(planned, CAP, d)["ovs"] == pytest.approx(planned.switch_pps / d / 100_000)
    assert d == 2000


def test_slow_nic_engines_raise_the_dilation_and_ovs_takes_a_core_from_them():
    planned = load(spec({"type": "allreduce", "size": "8MB"}))
    slow = Capacity(ovs_pps=100_000, nic_pps=20_000, cores=2, mtu=4200, ovs_wakeup_s=100e-6)
    d = choose_dilation(planned, slow)
    use = utilisation(planned, slow, d)
    assert use["nic"] <= 0.5 and use["nic"] > use["ovs"]
    assert d == 10_000
    # OVS's cores: its frames at the wakeup cost (100 us each), here about half a core; the
    # engines get the rest.
    ovs = planned.switch_pps / d * 100e-6
    assert 0.4 < ovs < 0.6
    assert use["nic"] == pytest.approx(planned.nic_pps / d / 20_000 / (2 - ovs))
    # At 5000 OVS would take a whole core, leaving one to the engines: 51% busy, too much.
    assert utilisation(planned, slow, 5000)["nic"] == pytest.approx(planned.nic_pps / 5000 / 20_000)
    # with more cores there is room for more engines, and the dilation can drop
    assert choose_dilation(planned, Capacity(100_000, 20_000, 8, 4200, 100e-6)) < d


def test_a_light_load_runs_undilated_and_an_impossible_one_gets_the_maximum():
    tiny = PlannedLoad(switch_pps=1_000, nic_pps=1_000, host_pps={"h1": 500, "h2": 500}, flows=1, frame_bytes=FRAME)
    assert choose_dilation(tiny, CAP) == 1
    huge = PlannedLoad(switch_pps=1e12, nic_pps=1e12, host_pps={"h1": 1e12}, flows=1, frame_bytes=FRAME)
    assert choose_dilation(huge, CAP) == MAX_DILATION


def test_busiest_engine_is_one_process_on_one_core():
    # one host does all the work: spreading the rest over engines does not help it
    skew = PlannedLoad(switch_pps=1, nic_pps=2_000_000, host_pps={"h1": 1_000_000, "h2": 1_000, "h3": 999_000},
                       flows=2, frame_bytes=FRAME)
    many = Capacity(ovs_pps=1e9, nic_pps=100_000, cores=16, mtu=4200)
    use = utilisation(skew, many, 100)
    assert use["busiest_engine"] == pytest.approx(0.1)  # h1 (1M/s) alone on its engine, /100
    assert choose_dilation(skew, many) == 20


def test_explain_gives_the_figures_behind_the_choice():
    planned = load(spec({"type": "allreduce", "size": "8MB"}))
    e = explain(planned, CAP, 2000)
    assert e["dilation"] == 2000 and e["margin"] == 0.5
    assert e["planned_at_dilation"]["switch_pps"] == round(planned.switch_pps / 2000)
    assert e["capacity"]["ovs_pps_per_core"] == 100_000 and e["engines"] == 2
    assert "ovs limits" in e["reason"]
    json.dumps(e)


def test_capacity_cache_is_keyed_by_the_machine_and_the_mtu(tmp_path: Path):
    path = tmp_path / "capacity.json"
    key = {"cpu_model": "X", "cores": 2, "kernel": "6.1", "openvswitch": "3.1.0", "probe_version": 1,
           "nic_probe_version": 1}
    assert capacity.cached(4200, path, key) is None
    capacity.store(CAP, path, key)
    assert capacity.cached(4200, path, key) == CAP
    assert capacity.cached(9000, path, key) is None  # measured at another MTU
    assert capacity.cached(4200, path, {**key, "openvswitch": "3.2.0"}) is None  # stale
    nine = Capacity(ovs_pps=50_000, nic_pps=1, cores=2, mtu=9000)
    capacity.store(nine, path, key)
    assert capacity.cached(4200, path, key) == CAP and capacity.cached(9000, path, key) == nine
    capacity.store(nine, path, {**key, "kernel": "6.2"})  # a new machine key drops the old entries
    assert capacity.cached(4200, path, {**key, "kernel": "6.2"}) is None
    path.write_text("{not json")
    assert capacity.cached(4200, path, key) is None


def test_machine_key_names_what_makes_a_measurement_stale():
    assert set(capacity.machine_key()) == {"cpu_model", "cores", "kernel", "openvswitch", "probe_version",
                                           "nic_probe_version"}


def test_auto_without_a_cache_is_provisional_and_with_one_is_chosen(tmp_path: Path, monkeypatch):
    s = spec({"type": "allreduce", "size": "8MB"})
    plan1 = build_plan(s.topology, dilation=1.0)
    ranks = [h.name for h in plan1.hosts]
    monkeypatch.setattr(capacity, "cached", lambda mtu, **kw: None)
    s2, plan = capacity.resolve_auto(s, plan1, ranks, measure=False)
    assert plan.extra["dilation_auto"]["dilation"] is None and plan.dilation == capacity.PROVISIONAL_DILATION
    monkeypatch.setattr(capacity, "cached", lambda mtu, **kw: CAP)
    s2, plan = capacity.resolve_auto(s, plan1, ranks, measure=False)
    assert s2.topology.dilation == plan.dilation == 2000 and plan.extra["dilation_auto"]["dilation"] == 2000
    assert plan.host_rate_bps("h1") == 100e9 / 2000
    # the resolved spec says the number, so experiment.yaml reruns at the same dilation
    assert s2.model_dump(mode="json")["topology"]["dilation"] == 2000.0


def test_a_numeric_dilation_is_unchanged():
    s = spec({"type": "allreduce", "size": "8MB"}, dilation=4000)
    assert s.topology.dilation == 4000.0 and build_plan(s.topology).dilation == 4000.0
    with pytest.raises(ValueError, match="auto"):
        build_plan(spec({"type": "allreduce", "size": "8MB"}).topology)


@pytest.mark.parametrize("value, message", [
    ("fast", "dilation: got 'fast' (a number from 1 to 1,000,000, or auto)"),
    ("0", "dilation: 0 is out of range (a number from 1 to 1,000,000, or auto)"),
    ("true", "dilation: got True (a number from 1 to 1,000,000, or auto)"),
])
def test_bad_dilation_names_the_file_and_field(spec_dir: Path, value: str, message: str):
    with pytest.raises(SpecError) as e:
        load_experiment(spec_dir / "exp.yaml", [f"topology.dilation={value}"])
    assert e.value.lines() == [f"{spec_dir / 'topo.yaml'}: {message}"]


def test_show_prints_the_chosen_dilation_and_the_figures_behind_it(spec_dir: Path):
    from tests.unit.test_cli_input_errors import fabric_emu

    state = spec_dir / "state"
    state.mkdir()
    capacity.store(CAP, state / "capacity.json", capacity.machine_key())  # measured before
    r = fabric_emu(["show", "exp.yaml", "--set", "topology.dilation=auto", "--set", "datapath=userspace"], spec_dir)
    assert r.returncode == 0, r.stderr
    assert "dilation auto: 2000" in r.stdout and "dilation 2000" in r.stdout
    assert "-> 25,480 frame-hops/s, of 100,000/s per core: 25%" in r.stdout


def test_show_without_a_measurement_says_it_is_provisional():
    from rich.console import Console

    from fabric_emu.run.show import print_plan

    s = spec({"type": "allreduce", "size": "8MB"})
    plan1 = build_plan(s.topology, dilation=1.0)
    ranks = [h.name for h in plan1.hosts]
    import unittest.mock as mock

    with mock.patch.object(capacity, "cached", lambda mtu, **kw: None):
        s, plan = capacity.resolve_auto(s, plan1, ranks, measure=False)
    out = Console(record=True, width=200)
    print_plan(out, plan, s, ranks)
    text = out.export_text()
    assert "dilation auto: not chosen yet" in text and "provisional dilation 2000" in text
    assert "fabric-emu run` measures it" in text


def test_bad_dilation_on_the_command_line_exits_2(spec_dir: Path):
    from tests.unit.test_cli_input_errors import fabric_emu

    r = fabric_emu(["run", "exp.yaml", "--set", "topology.dilation=soon"], spec_dir)
    assert r.returncode == 2
    assert r.stderr.strip() == (f"error: {spec_dir / 'topo.yaml'}: dilation: got 'soon' "
                                "(a number from 1 to 1,000,000, or auto)")
