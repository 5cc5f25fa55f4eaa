"""Multi-GPU servers end to end (issue 22): the shipped experiments through `fabric-emu run`,
judged on the switches' counters, the NICs' and the scale-up domains' byte counts and the
measured step times.

* experiments/gpu-servers-3d.yaml (servers of 4 GPUs, 2 under each of 2 leaves, 2 spines):
  tp 4 x pp 2 x dp 2. Topology-aware placement keeps every tensor-parallel group in a server,
  so no TP byte passes a switch: the switches deliver to the hosts only the pipeline and
  data-parallel bytes, and the servers' domains carry the TP all-reduces. Naive placement
  spreads each TP group over all four servers: its TP bytes cross the leaves and the spines,
  and its step is slower.
* experiments/rail-pxn.yaml (a rail-optimized fabric of 2 servers x 2 GPUs): an all-to-all.
  With PXN the traffic between rails crosses inside the sending server, and the spines carry
  next to nothing; without it, that traffic goes from rail to rail through the spines.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fabric_emu.spec.load import load_experiment
from fabric_emu.topo.plan import build_plan
from fabric_emu.workloads import jobs
from fabric_emu.workloads.program import FABRIC, RECV, SCALE_UP
from tests.integration.fabric_checks import REPO, read_csv, read_json, run_shipped

pytestmark = [pytest.mark.root, pytest.mark.slow]

HEADERS = 1.05  # RoCE headers and ACKs on top of the payload (4 KB frames): a few per cent


def run_ok(tmp_path_factory, name: str, *sets: str) -> tuple[Path, dict]:
    run_dir, r = run_shipped(tmp_path_factory, name, *sets)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s = read_json(run_dir / "summary.json")
    assert s["status"] == "ok" and all(j["status"] == "ok" for j in s["jobs"]), s.get("error")
    return run_dir, s


def program_of(name: str, *sets: str):
    spec = load_experiment(REPO / "experiments" / f"{name}.yaml", list(sets))
    plan = build_plan(spec.topology)
    return plan, jobs.build_program(jobs.resolve_jobs(spec, plan))


def port_bytes(run_dir: Path, switches: set[str] | None = None, kind: str | None = None) -> int:
    """Bytes the switches sent (tx) on their ports, of these switches and this kind of port."""
    return sum(int(r["tx_bytes"]) for r in read_csv(run_dir / "ports.csv")
               if (switches is None or r["switch"] in switches) and (kind is None or r["kind"] == kind))


def spine_bytes(run_dir: Path) -> int:
    """Bytes the spines forwarded (every spine port's tx): what crossed between leaves."""
    return sum(int(r["tx_bytes"]) for r in read_csv(run_dir / "ports.csv") if r["switch"].startswith("spine"))


def scale_up_received(run_dir: Path) -> int:
    total = 0
    for f in (run_dir / "agents").glob("*.json"):
        total += (read_json(f).get("scale_up") or {}).get("received_bytes", 0)
    return total


# --------------------------------------------------------------------------- 3D training on servers

@pytest.fixture(scope="module")
def placements(tmp_path_factory):
    return {p: run_ok(tmp_path_factory, "gpu-servers-3d", f"workload.placement={p}")
            for p in ("topology-aware", "naive")}


def test_topology_aware_sends_no_tensor_parallel_bytes_through_a_switch(placements):
    run_dir, s = placements["topology-aware"]
    plan, p = program_of("gpu-servers-3d")
    fabric = {"tp": 0, "other": 0}
    scale_up_tp = 0
    for o in p.ops:
        if o.kind != RECV:
            continue
        c = p.channels[o.channel]
        if c.via == FABRIC:
            fabric["tp" if c.stream == "tp" else "other"] += o.nbytes
        elif c.stream == "tp":
            scale_up_tp += o.nbytes
    assert fabric["tp"] == 0 and scale_up_tp > 5 * fabric["other"]  # the plan: TP all inside servers
    # Measured: the leaves delivered to their hosts the pipeline and data-parallel bytes and no
    # more; had the TP all-reduces gone through the fabric, several times as much.
    delivered = port_bytes(run_dir, {sw.name for sw in plan.leaves}, "host")
    assert fabric["other"] <= delivered <= HEADERS * fabric["other"], (delivered, fabric)
    # and the servers' modelled domains carried the TP bytes (all of their scale-up traffic)
    assert scale_up_received(run_dir) == sum(o.nbytes for o in p.ops if o.kind == RECV
                                             and p.channels[o.channel].via == SCALE_UP) >= scale_up_tp
    (job,) = s["jobs"]
    assert job["split_fabric_s"]["tp"] < 0.1 * job["step_time_fabric_s"], job["split_fabric_s"]


def test_topology_aware_is_faster_and_keeps_traffic_off_the_spines(placements):
    (dir_a, aware), (dir_n, naive) = placements["topology-aware"], placements["naive"]
    ta, tn = aware["jobs"][0]["step_time_fabric_s"], naive["jobs"][0]["step_time_fabric_s"]
    sa, sn = spine_bytes(dir_a), spine_bytes(dir_n)
    print(f"step time: topology-aware {ta * 1e6:.0f} us, naive {tn * 1e6:.0f} us; "
          f"bytes across the spines: topology-aware {sa:,}, naive {sn:,}")
    assert ta < 0.7 * tn, (ta, tn)
    assert sa < 0.5 * sn, (sa, sn)
    # naive's TP groups span the servers: its leaves delivered its TP bytes to the hosts too
    plan, p = program_of("gpu-servers-3d", "workload.placement=naive")
    tp_fabric = sum(o.nbytes for o in p.ops if o.kind == RECV and p.channels[o.channel].via == FABRIC
                    and p.channels[o.channel].stream == "tp")
    assert tp_fabric > 0
    assert port_bytes(dir_n, {sw.name for sw in plan.leaves}, "host") >= tp_fabric


# --------------------------------------------------------------------------- PXN on rails

@pytest.fixture(scope="module")
def pxn(tmp_path_factory):
    return {on: run_ok(tmp_path_factory, "rail-pxn", f"pxn={on}") for on in ("true", "false")}


def test_pxn_keeps_cross_rail_traffic_off_the_spines(pxn):
    (dir_on, on), (dir_off, off) = pxn["true"], pxn["false"]
    s_on, s_off = spine_bytes(dir_on), spine_bytes(dir_off)
    _, p_off = program_of("rail-pxn", "pxn=false")
    plan, p_on = program_of("rail-pxn", "pxn=true")
    leaf_of = {h.name: h.leaf for h in plan.hosts}
    cross = sum(o.nbytes for o in p_off.ops if o.kind == RECV and p_off.channels[o.channel].via == FABRIC
                and leaf_of[p_off.channels[o.channel].src] != leaf_of[p_off.channels[o.channel].dst])
    print(f"bytes through the spines: PXN {s_on:,}, no PXN {s_off:,} (cross-rail payload {cross:,}); "
          f"all-to-all time PXN {on['jobs'][0]['iteration_time_fabric_s'] * 1e6:.0f} us, "
          f"no PXN {off['jobs'][0]['iteration_time_fabric_s'] * 1e6:.0f} us")
    # without PXN every cross-rail byte went through a spine; with it, hardly anything did
    assert cross > 0 and cross <= s_off <= HEADERS * cross, (s_off, cross)
    assert s_on < 0.01 * s_off, (s_on, s_off)
    # with PXN the rails still carried every inter-server byte: each leaf delivered to its hosts
    # what the program sends over the fabric, relays included
    fabric_on = sum(o.nbytes for o in p_on.ops if o.kind == RECV and p_on.channels[o.channel].via == FABRIC)
    delivered = port_bytes(dir_on, {sw.name for sw in plan.leaves}, "host")
    assert fabric_on <= delivered <= HEADERS * fabric_on, (delivered, fabric_on)
    assert scale_up_received(dir_on) > scale_up_received(dir_off)  # the relay's first hops
