"""Parameter-server training beside a ring all-reduce of the same gradients, end to end on the real
fabric (experiments/parameter-server.yaml, one step of 4 MB to keep it short): both jobs finish,
every worker got its pulls, the servers' incast pauses their leaf, and the parameter server is
slower than the ring alone, as its two servers' links carry every worker's shard."""

from __future__ import annotations

import pytest

from fabric_emu.spec.load import load_experiment
from fabric_emu.topo.plan import build_plan
from fabric_emu.workloads import jobs
from fabric_emu.workloads.program import RECV
from tests.integration.fabric_checks import REPO, read_csv, read_json, run_shipped

pytestmark = [pytest.mark.root, pytest.mark.slow]

WORKLOADS = ("workloads=[{name: ps, type: parameter-server, size: 4MB, servers: 2, iterations: 1},"
             " {name: ring, type: allreduce, size: 4MB, iterations: 1}]")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir, r = run_shipped(tmp_path_factory, "parameter-server", WORKLOADS)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return run_dir, read_json(run_dir / "summary.json")


def test_both_jobs_finish_and_every_worker_got_its_pulls(run):
    run_dir, s = run
    assert s["status"] == "ok"
    ps, ring = s["jobs"]
    assert (ps["status"], ring["status"]) == ("ok", "ok")
    assert ps["servers"] == ["h7", "h8"] and ps["workers"] == [f"h{i}" for i in range(1, 7)]
    assert ps["worker_pulled_bytes"] == {f"h{i}": 4 * 10**6 for i in range(1, 7)}
    assert ps["server_pushed_bytes"] == {"h7": 12 * 10**6, "h8": 12 * 10**6}
    # and the NICs' own receive counters: every host got every byte both jobs send it
    spec = load_experiment(REPO / "experiments/parameter-server.yaml", [WORKLOADS])
    p = jobs.build_program(jobs.resolve_jobs(spec, build_plan(spec.topology)))
    for h in p.hosts:
        planned = sum(o.nbytes for o in p.ops if o.host == h and o.kind == RECV)
        got = sum(q["bytes"] for q in read_json(run_dir / "agents" / f"{h}.json")["recv_qps"])
        assert got == planned, (h, got, planned)


def test_the_servers_incast_pauses_their_leaf_and_costs_time(run):
    run_dir, s = run
    ps, ring = s["jobs"]
    # alone, a step moves 6 x 2 MB in and out of each server's link; a ring rank's, 2 x 7/8 x 4 MB
    assert ps["jct_alone_fabric_s"] > 2 * ring["jct_alone_fabric_s"], (ps["jct_alone_fabric_s"],
                                                                      ring["jct_alone_fabric_s"])
    leaf4 = [r for r in read_csv(run_dir / "ports.csv") if r["switch"] == "leaf4"]
    uplinks = sum(int(r["pause_tx_p3"]) for r in leaf4 if r["kind"] == "fabric")
    assert uplinks > 0, leaf4  # the servers' leaf holds back the spines while h7 and h8 drain
    assert s["switch"]["lossless_drops"] == 0 and s["transport"]["retransmitted_packets"] == 0
