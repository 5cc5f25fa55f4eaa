"""Scale-up transfers on a real run: two GPUs of one server (h1 on leaf1, h3 on leaf2) exchange
messages over their modelled scale-up domain while h2 and h4 run a sendrecv over the fabric.

The scale-up messages take bytes / rate + latency (modelled), shared max-min fairly: two
concurrent messages out of h1 take twice as long as the one coming back (a crossbar: the
other direction is not slowed); no switch port of h1 or h3 carries their bytes; the fabric
job still completes with every byte.

Until the spec has `servers:` (issue 22, the spec side), the server is set on the plan and the
scale-up transfers are added to the program by patching the two functions that make them.
"""

from __future__ import annotations

import dataclasses

import pytest

from fabric_emu.api import Experiment
from fabric_emu.run import prepare
from fabric_emu.topo.plan import Server
from fabric_emu.workloads import jobs
from fabric_emu.workloads.program import SCALE_UP
from tests.integration.fabric_checks import read_csv, read_json

pytestmark = [pytest.mark.root, pytest.mark.slow]

DILATION = 4000
GBPS, LATENCY = 100.0, 20e-6  # the server's scale-up domain, modelled: per GPU and direction
MB = 1_000_000
EXPERIMENT = {
    "name": "scale-up",
    "topology": {"name": "ls-1x2x2", "kind": "leaf-spine", "spines": 1, "leaves": 2, "hosts_per_leaf": 2,
                 "host_link": {"gbps": 100}, "fabric_link": {"gbps": 100}, "dilation": DILATION,
                 "mtu": 4200, "port_buffer": "1MB"},
    "load_balancing": "ecmp",
    "workload": {"type": "sendrecv", "size": "4MB", "iterations": 1, "ranks": ["h2", "h4"]},
    "seed": 1,
}


def with_server(topo, dilation=None):
    plan = build_plan(topo, dilation)
    return dataclasses.replace(plan, servers=[Server("srv1", ("h1", "h3"), GBPS, LATENCY)])


def with_scale_up(js):
    p = build_program(js)
    out = [p.transfer("gpu", f"out{k}", "h1", "h3", 2 * MB, via=SCALE_UP) for k in range(2)]
    back = p.transfer("gpu", "back", "h3", "h1", 2 * MB, via=SCALE_UP)
    with_scale_up.ops = out, back  # type: ignore[attr-defined]
    return p


build_plan, build_program = prepare.build_plan, jobs.build_program


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(prepare, "build_plan", with_server)
        mp.setattr(jobs, "build_program", with_scale_up)
        exp = Experiment.from_dict(EXPERIMENT)
        assert exp.ranks == ["h1", "h2", "h3", "h4"]
        results = exp.run(out=tmp_path_factory.mktemp("results"), quiet=True)
        program = with_scale_up(jobs.resolve_jobs(exp.spec, exp.plan))
    run_dir = results.path
    agents = {h: read_json(run_dir / "agents" / f"{h}.json") for h in exp.ranks}
    times = jobs.op_times(program, {h: a["ops"] for h, a in agents.items()})
    return run_dir, results.summary, agents, times


def modelled(t: tuple[float, float]) -> float:
    return (t[1] - t[0]) / DILATION


def test_scale_up_messages_take_bytes_over_the_shared_rate_plus_latency(run):
    _, s, agents, times = run
    (out0, out1), back = with_scale_up.ops
    rate = GBPS * 1e9 / 8
    # h1 -> h3 twice at once: h1's egress is shared, each at half the rate.
    for send, recv in (out0, out1):
        assert modelled(times[send]) == pytest.approx(2 * MB / (rate / 2) + LATENCY, rel=0.02)
        assert times[recv][1] == pytest.approx(times[send][1], abs=1e-6)  # one delivery ends both
    # h3 -> h1 at the same time: the other direction of the crossbar, at the full rate.
    assert modelled(times[back[0]]) == pytest.approx(2 * MB / rate + LATENCY, rel=0.02)
    # The engine that modelled them served both GPUs.
    assert agents["h1"]["engine"]["engine"] == agents["h3"]["engine"]["engine"]
    assert agents["h1"]["scale_up"]["sent_bytes"] == 4 * MB and agents["h3"]["scale_up"]["received"] == 2
    assert s["transport"]["scale_up_bytes"] == 6 * MB and s["transport"]["scale_up_transfers"] == 3
    assert any("modelled, not emulated" in n and "6,000,000 bytes" in n for n in s["fidelity"]["notes"])


def test_no_switch_carries_scale_up_bytes_and_the_fabric_job_completes(run):
    run_dir, s, agents, _ = run
    assert s["status"] == "ok" and s["jobs"][0]["status"] == "ok"
    ports = {r["peer"]: r for r in read_csv(run_dir / "ports.csv") if r["kind"] == "host"}
    # h1 and h3 sent no packets but pings and ARP; h2 and h4 sent the sendrecv's 4 MB each.
    for gpu in ("h1", "h3"):
        assert int(ports[gpu]["rx_bytes"]) < 10_000 and int(ports[gpu]["tx_bytes"]) < 10_000, ports[gpu]
        assert not agents[gpu]["send_qps"] and not agents[gpu]["recv_qps"]
    for h in ("h2", "h4"):
        assert int(ports[h]["rx_bytes"]) > 4 * MB
        assert sum(q["bytes"] for q in agents[h]["recv_qps"]) == 4 * MB
