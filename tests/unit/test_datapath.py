"""`datapath: auto | kernel | userspace`: the choice (with the module probe injected, so no root
and no openvswitch.ko are needed), its error, where it is recorded, and the kernel datapath's
fidelity and capacity arithmetic (per-CPU softirq from /proc/stat snapshots)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from fabric_emu.kernel import ovs_datapath
from fabric_emu.kernel.ovs_datapath import DatapathUnavailable, choose, datapath_of, parse_dpctl_show
from fabric_emu.measure import capacity, softirq
from fabric_emu.measure.dilation import Capacity
from fabric_emu.measure.fidelity import CpuMonitor, verdict
from fabric_emu.run.prepare import load_checked
from fabric_emu.spec.errors import SpecError

MISSING = "modprobe openvswitch: FATAL: Module openvswitch not found in directory /lib/modules/6.1.0"


def loaded():
    return True, "openvswitch module loaded"


def missing():
    return False, MISSING


def never():
    raise AssertionError("userspace needs no probe")


# --------------------------------------------------------------------------- the choice


def test_auto_takes_the_kernel_datapath_when_the_module_is_there():
    c = choose("auto", loaded)
    assert (c.datapath, c.reason, c.asked) == ("kernel", "openvswitch module loaded", "auto")


def test_auto_falls_back_to_userspace_and_says_why():
    c = choose("auto", missing)
    assert c.datapath == "userspace" and c.reason == MISSING + ": the userspace datapath instead"


def test_userspace_is_taken_without_probing():
    assert choose("userspace", never).datapath == "userspace"


def test_kernel_insists():
    assert choose("kernel", loaded).datapath == "kernel"
    with pytest.raises(DatapathUnavailable, match="FATAL: Module openvswitch not found"):
        choose("kernel", missing)


def test_probe_sees_a_loaded_module_without_modprobe(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("no modprobe when loaded"))
    assert ovs_datapath.probe_module(tmp_path) == (True, "openvswitch module loaded")


@pytest.mark.parametrize("root, cmd", [(True, ["modprobe", "openvswitch"]),
                                       (False, ["modprobe", "--dry-run", "openvswitch"])])
def test_probe_loads_the_module_as_root_and_only_asks_otherwise(tmp_path: Path, monkeypatch, root, cmd):
    calls = []

    def fake_run(args, **kw):
        calls.append(args)
        return subprocess.CompletedProcess(args, 1, "", "modprobe: FATAL: Module openvswitch not found in "
                                                        "directory /lib/modules/6.1.0\n")

    monkeypatch.setattr(subprocess, "run", fake_run)
    ok, why = ovs_datapath.probe_module(tmp_path / "absent", is_root=root)
    assert calls == [cmd] and not ok and why == MISSING
    monkeypatch.setattr(subprocess, "run", lambda args, **kw: subprocess.CompletedProcess(args, 0, "", ""))
    assert ovs_datapath.probe_module(tmp_path / "absent", is_root=root)[0]


def test_a_plan_nobody_chose_a_datapath_for_is_userspace():
    assert datapath_of({}) == "userspace"
    assert datapath_of({"datapath": {"datapath": "kernel"}}) == "kernel"


# --------------------------------------------------------------------------- the spec and the plan


def test_load_checked_records_the_choice_in_the_plan(spec_dir: Path):
    spec, plan, _ = load_checked(spec_dir / "exp.yaml", [], probe=loaded)
    assert spec.datapath == "auto"
    assert plan.extra["datapath"] == {"datapath": "kernel", "asked": "auto", "reason": "openvswitch module loaded"}
    _, plan, _ = load_checked(spec_dir / "exp.yaml", ["datapath=userspace"], probe=never)
    assert plan.extra["datapath"]["datapath"] == "userspace"
    _, plan, _ = load_checked(spec_dir / "exp.yaml", [], probe=missing)
    assert plan.extra["datapath"]["datapath"] == "userspace" and MISSING in plan.extra["datapath"]["reason"]


def test_kernel_that_cannot_load_is_one_line_naming_the_field(spec_dir: Path):
    with pytest.raises(SpecError) as e:
        load_checked(spec_dir / "exp.yaml", ["datapath=kernel"], probe=missing)
    assert e.value.lines() == [f"{spec_dir / 'exp.yaml'}: datapath: kernel: the openvswitch module cannot load "
                               f"on this machine ({MISSING}); allowed here: auto, userspace"]


def test_an_unknown_datapath_is_rejected(spec_dir: Path):
    with pytest.raises(SpecError) as e:
        load_checked(spec_dir / "exp.yaml", ["datapath=fast"], probe=never)
    assert "datapath" in e.value.lines()[0] and "userspace" in e.value.lines()[0]


@pytest.mark.skipif(Path("/sys/module/openvswitch").exists() or os.geteuid() != 0,
                    reason="needs a machine where openvswitch.ko cannot load (as this CI kernel)")
def test_run_with_kernel_where_the_module_cannot_load_exits_2_creating_nothing(spec_dir: Path):
    from tests.unit.test_cli_input_errors import fabric_emu

    before = set(os.listdir(spec_dir))
    r = fabric_emu(["run", "exp.yaml", "--out", "results", "--set", "datapath=kernel"], spec_dir)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: exp.yaml: datapath: kernel: "
                                                   "the openvswitch module cannot load"), lines
    assert set(os.listdir(spec_dir)) - before <= {"state"} and not (spec_dir / "results").exists()


def test_show_says_which_datapath_and_why(spec_dir: Path):
    from tests.unit.test_cli_input_errors import fabric_emu

    r = fabric_emu(["show", "exp.yaml", "--set", "datapath=userspace"], spec_dir)
    assert r.returncode == 0, r.stderr
    assert "OVS datapath: userspace (datapath: userspace asked for)" in r.stdout


def test_summary_and_its_table_carry_the_datapath():
    from fabric_emu.kernel.ovs_datapath import datapath_fields
    from fabric_emu.results.table import summary_rows

    extra = {"datapath": {"datapath": "kernel", "asked": "auto", "reason": "openvswitch module loaded"}}
    assert datapath_fields(extra) == {"datapath": "kernel", "datapath_reason": "openvswitch module loaded"}
    assert datapath_fields({}) == {}
    s = {"status": "ok", "experiment": "e", "workload": "incast", "ranks": 2, "load_balancing": "ecmp", "dilation": 100,
         "cpu": {"kernel_datapath": {"softirq_busiest_cpu_mean": 0.4, "softirq_busiest_cpu_max": 0.8},
                 "threads": [{"label": "ovs-vswitchd", "thread": "handler1 (tid 9)", "busy_mean": 0.01,
                              "busy_max": 0.02},
                             {"label": "nic-engine 0", "thread": "python (tid 7)", "busy_mean": 0.5,
                              "busy_max": 0.7}]}}
    rows = [r[0] for r in summary_rows(s)]
    assert "kernel datapath: busiest CPU in softirq" in rows
    assert not any("ovs-vswitchd" in r for r in rows) and "busiest thread: nic-engine 0 (python (tid 7))" in rows


# --------------------------------------------------------------------------- kernel plumbing


DPCTL = """system@ovs-system:
  lookups: hit:1200 missed:34 lost:5
  flows: 12
  masks: hit:2400 total:2 hit/pkt:1.94
  port 0: ovs-system (internal)
  port 1: leaf1 (internal)
  port 2: leaf1-eth1
"""


def test_dpctl_show_is_parsed():
    assert parse_dpctl_show(DPCTL) == {"system@ovs-system": {"hit": 1200, "missed": 34, "lost": 5, "flows": 12}}
    assert parse_dpctl_show("") == {}


DPIF = """netdev@ovs-netdev: hit:0 missed:0
  other:
    other 65534/1: (tap)
system@ovs-system: hit:10 missed:2
  leaf1:
    leaf1 65534/1: (internal)
    leaf1-eth1 1/2: (system)
  spine1:
    spine1 65534/3: (internal)
"""


def test_dpif_show_tells_which_bridges_are_on_the_kernel_datapath(monkeypatch):
    assert ovs_datapath.parse_dpif_show(DPIF) == {"netdev@ovs-netdev": {"other"},
                                                  "system@ovs-system": {"leaf1", "spine1"}}
    monkeypatch.setattr(subprocess, "run", lambda args, **kw: subprocess.CompletedProcess(args, 0, DPIF, ""))
    assert ovs_datapath.bridges_off_the_kernel_datapath(["leaf1", "spine1", "other", "leaf2"]) == ["other", "leaf2"]


def test_the_kernel_datapath_is_created_once_and_never_twice(monkeypatch):
    calls = []

    def fake_run(args, **kw):
        calls.append(args)
        out = DPCTL if args == ["ovs-dpctl", "show"] and len(calls) > 2 else ""
        return subprocess.CompletedProcess(args, 0, out, "")

    monkeypatch.setattr(subprocess, "run", fake_run)
    assert ovs_datapath.ensure_kernel_datapath() is True  # none yet: created
    assert calls == [["ovs-dpctl", "show"], ["ovs-dpctl", "add-dp", "system@ovs-system"]]
    assert ovs_datapath.ensure_kernel_datapath() is False  # there: left alone
    assert calls[2:] == [["ovs-dpctl", "show"]]


# --------------------------------------------------------------------------- softirq arithmetic

#          user nice system idle iowait irq softirq steal
STAT0 = """cpu  300 0 200 1000 0 0 150 0 0 0
cpu0 100 0 100 500 0 0 100 0 0 0
cpu1 200 0 100 500 0 0 50 0 0 0
intr 1 2 3
"""
STAT1 = """cpu  400 0 260 1100 0 0 290 0 0 0
cpu0 110 0 120 505 0 5 160 0 0 0
cpu1 290 0 140 595 0 0 65 0 0 0
"""


def test_per_cpu_softirq_from_two_snapshots():
    a, b = softirq.parse_proc_stat(STAT0), softirq.parse_proc_stat(STAT1)
    assert set(a) == {"cpu0", "cpu1"} and a["cpu0"] == [100, 0, 100, 500, 0, 0, 100, 0]
    s = softirq.shares(a, b)
    # cpu0: 10 user + 20 system + 5 idle + 5 irq + 60 softirq = 100 ticks
    assert s["cpu0"].softirq == pytest.approx(0.65) and s["cpu0"].system == pytest.approx(0.2)
    assert s["cpu0"].busy == pytest.approx(0.95)
    # cpu1: 90 + 40 + 95 + 15 = 240 ticks
    assert s["cpu1"].softirq == pytest.approx(15 / 240) and s["cpu1"].busy == pytest.approx(145 / 240)
    assert softirq.cpu_seconds(a, b, tick_hz=100) == pytest.approx({"softirq": 0.8, "system": 0.6})
    assert softirq.shares(b, b) == {}  # no tick in between: nothing to say


def test_cpu_monitor_reports_the_kernel_datapath_and_its_verdict():
    cpu = CpuMonitor(datapath="kernel", ovs=False)
    cpu._stat0, cpu._stat1 = softirq.parse_proc_stat(STAT0), softirq.parse_proc_stat(STAT1)
    cpu._seconds = 2.0
    cpu._dp0 = {"hit": 10, "missed": 2, "lost": 0, "flows": 1}
    cpu._dp1 = {"hit": 1010, "missed": 4, "lost": 3, "flows": 1}
    cpu.softirq_max = [0.5, 0.95, 0.92, 0.3]
    kd = cpu.summary()["kernel_datapath"]
    assert kd["softirq_busiest_cpu_mean"] == pytest.approx(0.667, abs=1e-3)
    assert kd["softirq_busiest_cpu_max"] == 0.95 and kd["softirq_saturated_fraction"] == 0.5
    assert kd["lookups"] == {"hit": 1000, "missed": 2, "lost": 3}
    assert kd["softirq_cpu_s"] == pytest.approx(80 / softirq.CLK_TCK, abs=1e-3)
    warnings = verdict({"kernel_datapath": kd}, [])
    assert len(warnings) == 2 and "softirq" in warnings[0] and "lost 3 upcall(s)" in warnings[1]
    assert verdict({"kernel_datapath": {**kd, "softirq_saturated_fraction": 0.1,
                                        "lookups": {"lost": 0}}}, []) == []
    # the userspace datapath's summary is as before: no kernel block
    assert "kernel_datapath" not in CpuMonitor(ovs=False).summary()


def test_trust_section_names_the_kernel_datapaths_figure():
    from fabric_emu.results.trust import cpu_section

    cpu = {"cpu_busy_mean": 0.5, "datapath": "kernel", "kernel_datapath": {"softirq_busiest_cpu_max": 0.7}}
    assert cpu_section(cpu)["kernel_datapath"] == {"softirq_busiest_cpu_max": 0.7}
    assert "kernel_datapath" not in cpu_section({"cpu_busy_mean": 0.5})


# --------------------------------------------------------------------------- capacity per datapath


def test_capacity_cache_keeps_each_datapath_apart(tmp_path: Path):
    path = tmp_path / "capacity.json"
    key = {"machine": "x", "probe_version": capacity.PROBE_VERSION}
    user = Capacity(ovs_pps=30_000, nic_pps=100_000, cores=2, mtu=4200)
    kern = Capacity(ovs_pps=400_000, nic_pps=100_000, cores=2, mtu=4200, datapath="kernel")
    capacity.store(user, path, key)
    assert capacity.cached(4200, path, key, datapath="kernel") is None  # userspace's is not the kernel's
    capacity.store(kern, path, key)
    assert capacity.cached(4200, path, key) == user
    assert capacity.cached(4200, path, key, datapath="kernel") == kern
    assert capacity.cached(4200, path, key, datapath="kernel").datapath == "kernel"


def test_a_cache_of_the_first_probe_version_is_stale(tmp_path: Path):
    path = tmp_path / "capacity.json"
    old_key = {**capacity.machine_key(), "probe_version": 1}
    path.write_text('{"machine": %s, "by_mtu": {"4200": {"ovs_pps": 1, "nic_pps": 1, "cores": 2, "mtu": 4200}}}'
                    % __import__("json").dumps(old_key))
    assert capacity.PROBE_VERSION >= 2 and capacity.cached(4200, path) is None


def test_kernel_hop_cost_is_the_bridge_less_the_direct_pair():
    # 2.0 s of kernel time for 100k frames through the bridge, 0.5 s for 100k straight across
    assert capacity.kernel_hop_cost(2.0, 100_000, 0.5, 100_000) == pytest.approx(15e-6)
    # the direct pair cannot make a hop cost less than a quarter of the bridge path's
    assert capacity.kernel_hop_cost(1.0, 100_000, 1.2, 100_000) == pytest.approx(2.5e-6)
    with pytest.raises(capacity.ProbeError):
        capacity.kernel_hop_cost(0.0, 100_000, 0.5, 100_000)


def test_auto_resolves_dilation_from_the_chosen_datapaths_capacity(spec_dir: Path, monkeypatch):
    asked = []

    def fake_cached(mtu, datapath="userspace", **kw):
        asked.append(datapath)
        return Capacity(ovs_pps=1e6, nic_pps=1e6, cores=2, mtu=mtu, datapath=datapath)

    monkeypatch.setattr(capacity, "cached", fake_cached)
    _, plan, _ = load_checked(spec_dir / "exp.yaml", ["topology.dilation=auto"], probe=loaded)
    assert asked == ["kernel"] and plan.extra["dilation_auto"]["capacity"]["datapath"] == "kernel"
    assert "kernel" in plan.extra["dilation_auto"]["capacity"]["datapath"]


def test_measure_kernel_derives_the_hop_cost_and_show_prints_it(monkeypatch):
    """measure_kernel's arithmetic and the figures show prints, with the probe network faked
    (the real one needs root and openvswitch.ko: tests/integration/test_kernel_datapath.py)."""
    from rich.console import Console

    from fabric_emu.measure.dilation import PlannedLoad, explain
    from fabric_emu.run.show import print_dilation_auto

    class FakeNet:
        def __init__(self, mtu, datapath):
            assert datapath == "kernel"

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

        def udp_blast(self, dst, seconds, rate="0", port=5301):
            n = 100_000 if dst == capacity.ADDRS[1] else 200_000  # through the bridge / direct
            return {"sent_pps": 2 * n / seconds, "received_pps": n / seconds, "received": n, "frame_bytes": 4214}

    # /proc/stat around each blast: direct 0.4 s softirq + 0.1 s system; bridge 1.5 + 0.5 s
    stats = iter([{"cpu0": [0, 0, 0, 0, 0, 0, 0, 0]}, {"cpu0": [0, 0, 10, 0, 0, 0, 40, 0]},
                  {"cpu0": [0, 0, 10, 0, 0, 0, 40, 0]}, {"cpu0": [0, 0, 60, 0, 0, 0, 190, 0]}])
    monkeypatch.setattr(capacity, "ProbeNet", FakeNet)
    monkeypatch.setattr(capacity.softirq, "read_proc_stat", lambda: next(stats))
    monkeypatch.setattr(capacity.softirq, "CLK_TCK", 100)
    monkeypatch.setattr(capacity.softirq.cpu_seconds, "__defaults__", (100,))
    monkeypatch.setattr(capacity.ovs_datapath, "probe_module", loaded)
    monkeypatch.setattr(capacity, "clean_stale", lambda: None)
    monkeypatch.setattr(capacity, "RunLock", lambda: type("L", (), {"acquire": lambda s: True,
                                                                     "release": lambda s: None})())
    monkeypatch.setattr(capacity.nic_capacity, "nic_capacity_pps", lambda payload: {"pps": 30_000.0, "what": "x"})
    cap = capacity.measure_kernel(4200)
    # per frame: 2.0 s / 100k through the bridge less 0.5 s / 200k direct = 17.5 us a hop
    assert cap.datapath == "kernel" and cap.details["ovs"]["hop_us"] == 17.5
    assert cap.ovs_pps == round(1 / 17.5e-6) and cap.ovs_wakeup_s == 0.0
    load = PlannedLoad(switch_pps=1e6, nic_pps=1e5, host_pps={"h1": 5e4, "h2": 5e4}, flows=2, frame_bytes=4214)
    out = Console(record=True, width=300)
    print_dilation_auto(out, {**explain(load, cap, 100), "capacity_details": cap.details})
    text = out.export_text()
    assert "OVS switching, kernel datapath (softirq), taken as one core" in text
    assert "OVS kernel datapath: 50,000 frames/s of 4214 B forwarded" in text and "17.5 us of kernel CPU" in text


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Mininet's isOldOVS uses distutils
@pytest.mark.parametrize("datapath, opt", [("user", "datapath_type=netdev"), ("kernel", "datapath_type=system")])
def test_fabric_switch_bridges_say_their_datapath_type(datapath: str, opt: str, monkeypatch):
    from mininet.node import OVSSwitch

    from fabric_emu.fabric.build import FabricSwitch
    from fabric_emu.state.records import OVS_OWNER_KEY

    sw = object.__new__(FabricSwitch)  # no shell: only the options of ovs-vsctl add-br
    sw.__dict__.update(name="leaf1", dpid="0000000000000001", failMode="secure", inband=False, datapath=datapath,
                       protocols="OpenFlow15", stp=False, run_id="r1")
    monkeypatch.setattr(OVSSwitch, "OVSVersion", "3.1", raising=False)  # set by Mininet's setup()
    opts = sw.bridgeOpts()
    assert opt in opts and f"external_ids:{OVS_OWNER_KEY}=r1" in opts
    assert ("datapath_type=system" in opts) == (datapath == "kernel")
