"""OVS's kernel datapath end to end: the quickstart on `datapath: kernel`, and the capacity probe
on it. Skipped where openvswitch.ko cannot load (our CI kernel has none); the lab VM (a Debian 12
kernel) runs them."""

from __future__ import annotations

import subprocess

import pytest
from pyroute2 import IPRoute

from fabric_emu.kernel.ovs_datapath import probe_module
from fabric_emu.measure import capacity
from fabric_emu.run.prepare import load_checked
from tests.integration.fabric_checks import REPO, fabric_emu, leftovers, only_run_dir, read_json

QUICKSTART = REPO / "experiments" / "quickstart.yaml"
_usable, _why = probe_module()
pytestmark = [pytest.mark.root, pytest.mark.slow,
              pytest.mark.skipif(not _usable, reason=f"no kernel datapath here ({_why})")]


@pytest.fixture(scope="module")
def kernel_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    r = fabric_emu("run", str(QUICKSTART), "--out", str(out), "--set", "datapath=kernel")
    return only_run_dir(out, "quickstart"), r


def test_quickstart_on_the_kernel_datapath(kernel_run):
    run_dir, r = kernel_run
    assert r.returncode == 0, r.stdout + r.stderr
    s = read_json(run_dir / "summary.json")
    assert s["status"] == "ok" and s["datapath"] == "kernel", s.get("datapath_reason")
    assert read_json(run_dir / "metadata.json")["datapath"] == "kernel"
    assert s["transport"]["lost_packets"] == 0 and s["switch"]["drops"] == 0
    assert s["busbw_fraction"] >= 0.7, s
    kd = s["cpu"]["kernel_datapath"]
    assert kd["lookups"]["lost"] == 0 and kd["lookups"]["hit"] > 0, kd  # handlers took every upcall
    assert s["fidelity"]["kernel_datapath_softirq_max"] is not None
    assert "kernel datapath: busiest CPU in softirq" in r.stdout


def test_kernel_run_leaves_nothing_behind(kernel_run):
    _, plan, _ = load_checked(QUICKSTART, ["datapath=kernel"])
    assert leftovers(plan) == []


def test_capacity_probe_on_the_kernel_datapath():
    cap = capacity.measure(4200, "kernel")
    ovs = cap.details["ovs"]
    assert cap.datapath == "kernel" and ovs["datapath"] == "kernel"
    assert ovs["forwarded_pps"] > 1000 and ovs["hop_us"] > 0 and cap.ovs_pps == pytest.approx(1e6 / ovs["hop_us"], rel=0.01)
    bridges = subprocess.run(["ovs-vsctl", "list-br"], capture_output=True, text=True, check=True).stdout.split()
    assert capacity.BRIDGE not in bridges
    with IPRoute() as ipr:
        assert not {ln.get_attr("IFLA_IFNAME") for ln in ipr.get_links()} & set(capacity.ROOT_ENDS)
