"""Parameter-server training: roles on the fabric, the built program (ops, bytes per channel,
dependencies), sync as a barrier and async's staleness bound on fake NICs (tests/unit/program_sim),
spec mistakes at their field, and the summary of the shipped experiment from fake NIC times."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabric_emu.run.prepare import load_checked
from fabric_emu.spec.errors import SpecError
from fabric_emu.spec.load import load_experiment
from fabric_emu.spec.workloads import ParameterServerWorkload
from fabric_emu.workloads import jobs
from fabric_emu.workloads.parameter_server import PULL, PUSH, ps_program, ps_results, roles
from fabric_emu.workloads.program import COMPUTE, RECV, SEND
from tests.unit import program_sim
from tests.unit.test_job_specs import write
from tests.unit.test_workload_specs import REPO

HOSTS = [f"h{i}" for i in range(1, 9)]
W, S = ["h1", "h2", "h3"], ["h7", "h8"]


def ps(**kw) -> ParameterServerWorkload:
    return ParameterServerWorkload(type="parameter-server", **{"size": 6000, **kw})


def test_roles_from_a_count_a_list_and_all():
    assert roles(ps(servers=2), HOSTS) == (HOSTS[:6], ["h7", "h8"])
    assert roles(ps(servers=1, workers=["h1", "h8"]), HOSTS) == (["h1", "h8"], ["h7"])
    assert roles(ps(servers=["h1"]), HOSTS) == (HOSTS[1:], ["h1"])
    with pytest.raises(ValueError, match="leave no worker"):
        roles(ps(servers=8), HOSTS)


def test_sync_program_ops_bytes_and_dependencies():
    p = ps_program("ps", W, S, 6001, 2, compute=1e-3)
    p.check()
    per_step = 3 + 2 * 6 + 2 + 2 * 6  # computes, push pairs, one aggregation per server, pull pairs
    assert len(p.ops) == 2 * per_step
    for c in p.channels:  # one message per step per channel, the server's shard each way
        msgs = [o.nbytes for o in p.ops if o.kind == SEND and p.channels[o.channel] == c]
        assert msgs == [3001, 3001] if "h7" in (c.src, c.dst) else msgs == [3000, 3000]
        assert c.stream == (PUSH if c.dst in S else PULL)
    assert len(p.channels) == 2 * 3 * 2
    # a worker's step-1 compute waits for its two step-0 pulls
    c1 = next(o for o in p.ops if o.host == "h2" and o.kind == COMPUTE and o.step == 1)
    assert sorted(p.ops[d].cat for d in c1.deps) == [PULL, PULL]
    assert all(p.ops[d].kind == RECV and p.ops[d].step == 0 for d in c1.deps)
    # sync: a server's pull sends wait for one join over every worker's push of the step
    pull = next(o for o in p.ops if o.host == "h8" and o.kind == SEND and o.step == 1)
    (agg,) = pull.deps
    assert len(p.ops[agg].deps) == 3 and {p.ops[d].cat for d in p.ops[agg].deps} == {PUSH}
    assert p.bytes_sent() == {"h1": 2 * 6001, "h2": 2 * 6001, "h3": 2 * 6001, "h7": 2 * 3 * 3001,
                              "h8": 2 * 3 * 3000}


def test_async_answers_each_push_within_the_staleness():
    p = ps_program("ps", W, S, 6000, 3, staleness=1)
    p.check()
    pull = next(o for o in p.ops if o.host == "h7" and o.kind == SEND and o.step == 2
                and p.channels[o.channel].dst == "h2")
    (applied,) = pull.deps
    deps = [p.ops[d] for d in p.ops[applied].deps]
    # h2's own step-2 push and every worker's step-1 push
    assert sorted((p.channels[o.channel].src, o.step) for o in deps) == [("h1", 1), ("h2", 1), ("h2", 2), ("h3", 1)]
    first = next(o for o in p.ops if o.host == "h7" and o.kind == SEND and o.step == 0)
    assert [p.ops[d].step for d in p.ops[first.deps[0]].deps] == [0]  # nothing k steps back yet


def _run(staleness: int, compute) -> tuple[float, list]:
    p = ps_program("ps", W, S, 6000, 4, staleness=staleness, compute=compute)
    runners, _, end = program_sim.run(p, rate_Bps=1e6)
    return end, p, program_sim.times(p, runners)


def test_sync_is_a_barrier():
    slow = lambda w, n: 0.05 if (w, n) == (0, 0) else 0.001  # noqa: E731
    _, p, t = _run(0, slow)
    slow_push_end = max(t[o.id][1] for o in p.ops if o.kind == SEND and o.host == "h1" and o.step == 0)
    for o in p.ops:  # nobody computes step 1 before the straggler's step-0 push has left
        if o.kind == COMPUTE and o.cat == "compute" and o.step == 1:
            assert t[o.id][0] >= slow_push_end


def test_async_absorbs_a_rotating_straggler_and_keeps_its_bound():
    straggler = lambda w, n: 0.05 if w == n % 3 else 0.001  # noqa: E731  one slow worker per step
    sync_end, *_ = _run(0, straggler)
    async_end, p, t = _run(1, straggler)
    assert async_end < 0.8 * sync_end, (async_end, sync_end)
    # bound: a worker's step-n compute starts after every worker's step n-2 push has arrived
    push_in = {(p.channels[o.channel].src, o.step): t[o.id][1] for o in p.ops if o.kind == RECV and o.cat == PUSH}
    for o in p.ops:
        if o.kind == COMPUTE and o.cat == "compute" and o.step >= 2:
            assert all(t[o.id][0] >= push_in[(v, o.step - 2)] for v in W)
    res = ps_results("ps", ps(size=6000, iterations=4, mode="async"), W, S, p, t, 1.0)
    assert res["bytes_pushed"] == res["bytes_pulled"] == 4 * 3 * 6000
    assert res["step_time_fabric_s"] == pytest.approx(sum(s["time_s"] for s in res["per_step"]) / 4)


@pytest.mark.parametrize("body,field,words", [
    ("workload: {type: parameter-server, size: 1MB, servers: [h7], workers: [h1, h7]}",
     "workload.workers.1", "h7 is also a server"),
    ("workload: {type: parameter-server, size: 1MB, servers: 0}", "workload.servers", "at least 1 server"),
    ("workload: {type: parameter-server, size: 1MB, servers: 8}", "workload.servers", "leave no worker"),
    ("workload: {type: parameter-server, size: 1MB, servers: [h9]}", "workload.servers", "unknown host 'h9'"),
    ("workload: {type: parameter-server, size: 1MB, workers: [h1, h1]}", "workload.workers", "h1 more than once"),
    ("workload: {type: parameter-server, size: 1MB, staleness: 2}", "workload.staleness", "mode: async"),
    ("workload: {type: parameter-server, size: 3, servers: 2, qps_per_peer: 2}", "workload.size", "smaller than"),
    ("workloads: [{type: parameter-server, size: 1MB, servers: [h1, h42]}]", "workloads.0.servers",
     "unknown host 'h42'"),
])
def test_each_mistake_is_one_problem_at_its_field(spec_dir: Path, body: str, field: str, words: str):
    with pytest.raises(SpecError) as exc:
        load_checked(write(spec_dir, body), [])
    (f, fld, msg), = exc.value.problems
    assert f.endswith("exp.yaml") and fld == field and words in msg and "\n" not in msg, (fld, msg)


def test_summary_of_the_shipped_experiment_from_fake_nics():
    from fabric_emu.results.jobs import jobs_section
    from fabric_emu.results.table import _job_rows
    from fabric_emu.topo.plan import build_plan

    spec = load_experiment(REPO / "experiments/parameter-server.yaml")
    plan = build_plan(spec.topology)
    js = jobs.resolve_jobs(spec, plan)
    assert js[0].roles == (HOSTS[:6], ["h7", "h8"]) and js[0].hosts == HOSTS
    p = jobs.build_program(js)
    runners, _, _ = program_sim.run(p, rate_Bps=plan.host_rate_bps("h1") / 8)
    agents = {h: {"ops": r.op_log()} for h, r in runners.items()}
    a, b = jobs_section(spec, plan, agents, {})["jobs"]
    assert (a["type"], a["status"], b["status"]) == ("parameter-server", "ok", "ok")
    assert a["bytes_pushed"] == a["bytes_pulled"] == 2 * 6 * 8 * 10**6
    assert a["server_pushed_bytes"] == {"h7": 48 * 10**6, "h8": 48 * 10**6}
    assert a["worker_pulled_bytes"] == dict.fromkeys(HOSTS[:6], 16 * 10**6)
    # fake NICs share nothing: a step is a worker's push then its pull, 2 x 4 MB per server at line rate
    assert a["step_time_fabric_s"] == pytest.approx(2 * 4e6 * 8 / 100e9, rel=0.01)
    assert any("step time" in r[0] for r in _job_rows(a, plan.dilation))
