"""Fat-tree, rail-optimized and custom (a ring) fabrics for real (Mininet, OVS, os-ken, agents): every host
reaches every other, also around a failed link, and the shipped quickstarts' ring all-reduce
runs at the host link rate with results the fidelity check trusts."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from fabric_emu.state.cleanup import clean_record
from fabric_emu.run.prepare import load_checked
from fabric_emu.fabric.events import rest_call
from fabric_emu.topo.plan import FabricPlan
from fabric_emu.state.records import RunLock, RunRecord
from fabric_emu.fabric.routed import RoutedFabric
from tests.integration.fabric_checks import REPO, leftovers, read_csv, read_json, run_shipped

pytestmark = [pytest.mark.root, pytest.mark.slow]

EXPERIMENTS = ["quickstart-fat-tree", "quickstart-rail", "quickstart-ring"]
# A link between two upper-tier switches (fat-tree) or a rail leaf and a spine, taken down.
CUT = {"quickstart-fat-tree": ("agg1", "core1"), "quickstart-rail": ("g1rail1", "spine1"),
       "quickstart-ring": ("r1", "r2")}


def unreachable(routed: RoutedFabric, plan: FabricPlan) -> list[str]:
    """Every host pings every other host, all hosts at once; the pairs that got no answer."""
    procs = []
    for src in plan.hosts:
        ips = " ".join(h.ip for h in plan.hosts if h is not src)
        script = f"for ip in {ips}; do ping -c1 -W2 -q $ip >/dev/null 2>&1 || echo $ip; done"
        procs.append((src.name, routed.fabric.host(src.name).popen(
            ["sh", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)))
    return [f"{src} -> {ip}" for src, p in procs for ip in p.communicate(timeout=120)[0].split()]


def reachable_after_retry(routed: RoutedFabric, plan: FabricPlan) -> list[str]:
    """A first ping also resolves ARP through the controller; a lost one is retried once."""
    failed = unreachable(routed, plan)
    return unreachable(routed, plan) if failed else []


@pytest.fixture(params=EXPERIMENTS)
def routed(request):
    """The experiment's fabric, built and routed as `fabric-emu run` does, with no traffic
    (for one test: it holds the run lock, which the runs below need)."""
    _, plan, _ = load_checked(REPO / "experiments" / f"{request.param}.yaml", [])
    lock = RunLock()
    assert lock.acquire(), "another fabric-emu run is in progress"
    workdir = Path(tempfile.mkdtemp(prefix="fabric-emu-itest-"))
    record = RunRecord.new(f"itest-{os.getpid()}-{time.time_ns()}")
    record.paths = [str(workdir)]
    record.save()
    fabric = RoutedFabric(plan, record, workdir)
    try:
        fabric.up(ready_timeout_s=60)
        yield request.param, plan, fabric
    finally:
        fabric.down()
        clean_record(record)
        lock.release()


def test_every_host_reaches_every_host_also_around_a_failed_link(routed):
    name, plan, fabric = routed
    assert reachable_after_retry(fabric, plan) == []
    a, b = CUT[name]
    fabric.fabric.set_link(a, b, up=False)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        state = rest_call(fabric.ctrl.rest_url)
        if state["links_down"] == ["-".join(sorted((a, b)))] and state["link_changes"]:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"the controller did not reroute around {a}-{b}: {state}")
    assert state["link_changes"][-1]["answered"] and not state["link_changes"][-1]["switch_errors"]
    assert unreachable(fabric, plan) == []  # ARP is resolved: no retry needed now
    fabric.fabric.set_link(a, b, up=True)


@pytest.fixture(scope="module", params=EXPERIMENTS)
def run(request, tmp_path_factory):
    run_dir, r = run_shipped(tmp_path_factory, request.param)
    return request.param, run_dir, r


def test_ring_allreduce_runs_at_the_link_rate_and_is_trusted(run):
    name, run_dir, r = run
    assert r.returncode == 0, r.stdout + r.stderr
    s = read_json(run_dir / "summary.json")
    spec, _, _ = load_checked(REPO / "experiments" / f"{name}.yaml", [])
    assert s["status"] == "ok" and s["iterations_completed"] == spec.workload.iterations
    assert s["fidelity"]["trusted"], s["fidelity"]
    assert 0.85 <= s["busbw_fraction"] <= 1.0, s["busbw_fraction"]
    assert s["switch"]["drops"] == 0 and s["transport"]["lost_packets"] == 0
    # In the shipped rank orders no link carries two flows, whatever ECMP hashes.
    assert s["ecmp"]["max_qps_per_uplink"] == 1, s["ecmp"]


def test_upper_tiers_carried_the_flows_that_left_their_leaf(run):
    """Bytes sent on the leaves' uplinks (plan.uplinks) cover every flow whose hosts sit on
    different leaves, and nothing more than those flows and their headers."""
    name, run_dir, _ = run
    _, plan, _ = load_checked(REPO / "experiments" / f"{name}.yaml", [])
    flows = read_csv(run_dir / "flows.csv")
    crossing = sum(int(f["bytes"]) for f in flows
                   if plan.host_by_name[f["src"]].leaf != plan.host_by_name[f["dst"]].leaf)
    uplinks = {(leaf.name, p.port) for leaf in plan.leaves for p in plan.uplinks(leaf.name)}
    up_tx = sum(int(p["tx_bytes"]) for p in read_csv(run_dir / "ports.csv")
                if (p["switch"], int(p["port"])) in uplinks)
    assert crossing > 0 and crossing <= up_tx <= crossing * 1.05


def test_nothing_left_behind():
    _, plan, _ = load_checked(REPO / "experiments" / "quickstart-fat-tree.yaml", [])
    assert leftovers(plan) == []
