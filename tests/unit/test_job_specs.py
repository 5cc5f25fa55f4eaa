"""Collective, pipeline, training and several-job specs: validation (one problem at its field),
the hosts that run a NIC, the default timeout, placement in `fabric-emu show`, and the summary
of a program run built from reported op times."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabric_emu.workloads import jobs
from fabric_emu.run.deadline import DEFAULT_TIMEOUT_BASE_S
from fabric_emu.run.prepare import load_checked
from fabric_emu.spec.errors import SpecError
from fabric_emu.spec.load import load_experiment
from tests.unit import program_sim
from tests.unit.test_workload_specs import REPO, fabric_emu


def write(spec_dir: Path, body: str) -> Path:
    (spec_dir / "exp.yaml").write_text(f"name: e\ntopology: topo.yaml\n{body}\n")
    return spec_dir / "exp.yaml"


@pytest.mark.parametrize("body,field,words", [
    ("workload: {type: allreduce, algorithm: halving-doubling, size: 1MB, ranks: [h1, h2, h3]}",
     "workload.algorithm", "power-of-two"),
    ("workload: {type: allreduce, algorithm: tree, size: 1MB}", "workload.algorithm", "'tree'"),
    ("workload: {type: alltoall, size: 4, ranks: all}", "workload.size", "smaller than"),
    ("workload: {type: allgather, size: 1MB, ranks: [h1, h99]}", "workload.ranks", "unknown host 'h99'"),
    ("workload: {type: pipeline, stages: [h1], forward: 1us, activation_size: 1KB}", "workload.stages", "at least 2"),
    ("workload: {type: pipeline, stages: [[h1, h2], [h3]], forward: 1us, activation_size: 1KB}",
     "workload.stages", "same number of hosts"),
    ("workload: {type: pipeline, stages: [h1, h1], forward: 1us, activation_size: 1KB}",
     "workload.stages", "h1 more than once"),
    ("workload: {type: pipeline, stages: [h1, h42], forward: 1us, activation_size: 1KB}",
     "workload.stages", "unknown host 'h42'"),
    ("workload: {type: pipeline, stages: [h1, h2], forward: 1us, activation_size: 1KB, schedule: zb}",
     "workload.schedule", "'zb'"),
    ("workload: {type: training, tp: 4, pp: 2, dp: 2, forward: 1us, activation_size: 1KB}",
     "workload.placement", "16 ranks, but the fabric has 8 hosts"),
    ("workload: {type: training, tp: 2, placement: [h1, h2, h3], forward: 1us, activation_size: 1KB}",
     "workload.placement", "lists 3 hosts"),
    ("workload: {type: training, forward: 1us, activation_size: 1KB}", "workload.dp", "at least 2 ranks"),
    ("workloads: [{type: incast, receiver: h1, size: 1MB}]", "workloads.0", "'incast'"),
    ("workloads: [{name: a, type: sendrecv, size: 1MB}, {name: a, type: alltoall, size: 1MB}]",
     "workloads.1.name", "names two jobs"),
    ("workloads: []", "workload", "either workload"),
])
def test_each_mistake_is_one_problem_at_its_field(spec_dir: Path, body: str, field: str, words: str):
    with pytest.raises(SpecError) as exc:
        load_checked(write(spec_dir, body), [])
    (f, fld, msg), = exc.value.problems
    assert f.endswith("exp.yaml") and fld == field and words in msg and "\n" not in msg, (fld, msg)


def test_hosts_and_timeout_of_a_pipeline(spec_dir: Path):
    spec, plan, ranks = load_checked(write(spec_dir, (
        "workload: {type: pipeline, stages: [h7, h2, h5], microbatches: 4, forward: 100us,"
        " backward: 200us, activation_size: 1MB}")), [])
    assert ranks == ["h2", "h5", "h7"]  # host order
    # busiest host: h2 (middle stage) sends and receives 2 x 4 x 1 MB over 50 Mb/s = 1.28 s,
    # and computes 4 x 300 us x 2000
    assert spec.timeout == pytest.approx(DEFAULT_TIMEOUT_BASE_S + 10 * (1.28 + 2.4))


def test_the_shipped_job_experiments_load_and_show():
    for name in ("allreduce-hd", "reducescatter", "allgather", "alltoall", "sendrecv", "pipeline-1f1b",
                 "training-3d", "two-jobs"):
        load_checked(REPO / "experiments" / f"{name}.yaml", [])
    r = fabric_emu(["show", str(REPO / "experiments/training-3d.yaml")], REPO)
    assert r.returncode == 0, r.stderr
    assert "placement" in r.stdout and "leaf2" in r.stdout
    r = fabric_emu(["show", str(REPO / "experiments/training-3d.yaml"), "--set", "workload.placement=naive"], REPO)
    assert r.returncode == 0, r.stderr


def test_placement_changes_what_crosses_the_spine():
    def across(placement: str) -> int:
        spec = load_experiment(REPO / "experiments/training-3d.yaml", [f"workload.placement={placement}"])
        from fabric_emu.topo.plan import build_plan
        plan = build_plan(spec.topology)
        js = jobs.resolve_jobs(spec, plan)
        p = jobs.build_program(js)
        leaf = {h.name: h.leaf for h in plan.hosts}
        return sum(o.nbytes for o in p.ops if o.kind == "send"
                   and leaf[p.channels[o.channel].src] != leaf[p.channels[o.channel].dst])
    assert across("topology-aware") < across("naive") / 4


def test_summary_of_two_jobs_from_fake_nics():
    """The summary's jobs section, from op times of a run on fake NICs (tests/unit/program_sim)."""
    from fabric_emu.topo.plan import build_plan
    from fabric_emu.results.jobs import jobs_section

    spec = load_experiment(REPO / "experiments/two-jobs.yaml")
    plan = build_plan(spec.topology)
    p = jobs.build_program(jobs.resolve_jobs(spec, plan))
    rate = plan.host_rate_bps("h1") / 8  # a fake wire at the emulated link rate
    runners, _, end = program_sim.run(p, rate_Bps=rate)
    agents = {h: {"ops": r.op_log()} for h, r in runners.items()}
    out = jobs_section(spec, plan, agents, {"allreduce": 1e-4})
    a, b = out["jobs"]
    assert (a["name"], b["name"]) == ("allreduce", "alltoall")
    assert a["status"] == b["status"] == "ok"
    assert a["busbw_fraction"] == pytest.approx(1.0, rel=1e-3)  # fake NICs: line rate, no sharing
    assert a["slowdown"] == pytest.approx(a["jct_fabric_s"] / 1e-4)
    assert "slowdown" not in b
