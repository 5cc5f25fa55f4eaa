"""Incast and flows workloads: validation (one problem per mistake, with its dotted field),
the hosts that run agents, --set, the default timeout, and `fabric-emu show`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fabric_emu.run.deadline import DEFAULT_TIMEOUT_BASE_S
from fabric_emu.run.prepare import load_checked
from fabric_emu.spec.errors import SpecError
from fabric_emu.spec.load import load_experiment

REPO = Path(__file__).resolve().parents[2]


def write(spec_dir: Path, workload: str) -> Path:
    (spec_dir / "exp.yaml").write_text(f"name: e\ntopology: topo.yaml\nworkload: {workload}\n")
    return spec_dir / "exp.yaml"


def test_incast_defaults_and_all_senders(spec_dir: Path):
    spec, plan, ranks = load_checked(write(spec_dir, "{type: incast, receiver: h3, size: 1MB}"), [])
    w = spec.workload
    assert (w.senders, w.iterations, w.qps_per_sender) == ("all", 1, 1)
    assert ranks == [h.name for h in plan.hosts]  # 'all': every host takes part


def test_only_the_hosts_of_the_workload_run_agents(spec_dir: Path):
    _, _, ranks = load_checked(write(spec_dir, "{type: incast, receiver: h5, senders: [h7, h2], size: 1MB}"), [])
    assert ranks == ["h2", "h5", "h7"]  # host order
    _, _, ranks = load_checked(write(
        spec_dir, "{type: flows, flows: [{src: h8, dst: h1, size: 1MB}, {src: h3, dst: h1, size: 2MB}]}"), [])
    assert ranks == ["h1", "h3", "h8"]


def test_flows_fields_and_units(spec_dir: Path):
    spec = load_experiment(write(spec_dir, "{type: flows, size: 2MB, flows: [{src: h1, dst: h5, start: 40us},"
                                           " {src: h2, dst: h6, size: 8MiB, qps: 4}]}"))
    f0, f1 = spec.workload.flows
    assert (f0.size, f0.qps, f0.start) == (None, 1, pytest.approx(40e-6))
    assert (f1.size, f1.qps, f1.start) == (8 * 2**20, 4, 0.0)


@pytest.mark.parametrize("workload,field,words", [
    ("{type: incast, receiver: h9, size: 1MB}", "workload.receiver", "unknown host 'h9'"),
    ("{type: incast, receiver: h1, senders: [h2, h42], size: 1MB}", "workload.senders.1", "unknown host 'h42'"),
    ("{type: incast, receiver: h1, senders: [h1, h2], size: 1MB}", "workload.senders.0", "is the receiver"),
    ("{type: incast, receiver: h1, senders: [h2, h3, h2], size: 1MB}", "workload.senders", "h2 more than once"),
    ("{type: incast, receiver: h1, senders: [], size: 1MB}", "workload.senders", "is empty"),
    ("{type: incast, receiver: h1, size: 2, qps_per_sender: 3}", "workload.size", "smaller than qps_per_sender"),
    ("{type: incast, receiver: h1, size: 1MB, qps: 2}", "workload.qps", "unknown key"),
    ("{type: incast, size: 1MB}", "workload.receiver", "required"),
    ("{type: flows, flows: []}", "workload.flows", "is empty"),
    ("{type: flows, flows: [{src: h1, dst: h2, size: 1MB}, {src: h4, dst: h4, size: 1MB}]}",
     "workload.flows.1.dst", "same host as src"),
    ("{type: flows, flows: [{src: h1, dst: h20, size: 1MB}]}", "workload.flows.0.dst", "unknown host 'h20'"),
    ("{type: flows, flows: [{src: h1, dst: h2}]}", "workload.flows.0.size", "required"),
    ("{type: flows, flows: [{src: h1, dst: h2, size: 1MB, start: soon}]}", "workload.flows.0.start", "a time such as"),
    ("{type: flows, flows: [{src: h1, dst: h2, size: 1MB, start: -1us}]}", "workload.flows.0.start", ""),
    ("{type: flows, flows: [{src: h1, dst: h2, size: 1MB, colour: red}]}", "workload.flows.0.colour", "unknown key"),
    ("{type: flows, flows: [{src: h1, dst: h2, size: 3, qps: 4}]}", "workload.flows.0.size", "smaller than qps"),
    ("{type: multicast, size: 1MB}", "workload", "'multicast'"),
])
def test_each_mistake_is_one_problem_at_its_field(spec_dir: Path, workload: str, field: str, words: str):
    with pytest.raises(SpecError) as exc:
        load_checked(write(spec_dir, workload), [])
    (f, fld, msg), = exc.value.problems
    assert f.endswith("exp.yaml") and fld == field and words in msg and "\n" not in msg, (fld, msg)


def test_an_incast_needs_a_sender(spec_dir: Path):
    with pytest.raises(SpecError) as exc:
        load_checked(write(spec_dir, "{type: incast, receiver: h1, size: 1MB}"),
                     ["topology.leaves=1", "topology.hosts_per_leaf=1"])
    (_, fld, msg), = exc.value.problems
    assert fld == "workload.senders" and "only host" in msg


def test_every_unknown_host_is_reported(spec_dir: Path):
    with pytest.raises(SpecError) as exc:
        load_checked(write(spec_dir, "{type: flows, flows: [{src: h10, dst: h2, size: 1MB},"
                                     " {src: h1, dst: h11, size: 1MB}]}"), [])
    assert [p[1] for p in exc.value.problems] == ["workload.flows.0.src", "workload.flows.1.dst"]


@pytest.mark.parametrize("workload,sizes", [
    ("{type: allreduce, size: 1MB}", lambda w: [w.size]),
    ("{type: incast, receiver: h1, size: 1MB}", lambda w: [w.size]),
    # flows: the workload's size is the size of every flow that does not give its own
    ("{type: flows, size: 1MB, flows: [{src: h1, dst: h2}, {src: h3, dst: h4}]}", lambda w: [w.size]),
])
def test_set_workload_size_works_for_every_type(spec_dir: Path, workload: str, sizes):
    spec, _, _ = load_checked(write(spec_dir, workload), ["workload.size=2MB"])
    assert sizes(spec.workload) == [2_000_000]


def test_set_workload_size_on_flows_sizes_the_flows_without_their_own(spec_dir: Path):
    from fabric_emu.workloads.flows import workload_flows

    spec, plan, _ = load_checked(write(spec_dir, "{type: flows, flows: [{src: h1, dst: h2},"
                                                 " {src: h3, dst: h4, size: 5MB}]}"), ["workload.size=2MB"])
    assert [f.size for f in workload_flows(spec.workload, [h.name for h in plan.hosts])] == [2_000_000, 5_000_000]


def test_default_timeout_uses_the_workload_line_rate(spec_dir: Path):
    # incast: 7 x 1 MB into h1's 50 Mb/s link = 1.12 s at line rate
    spec, _, _ = load_checked(write(spec_dir, "{type: incast, receiver: h1, size: 1MB}"), [])
    assert spec.timeout == pytest.approx(DEFAULT_TIMEOUT_BASE_S + 10 * 1.12)
    # flows: h5 receives 6 MB (0.96 s), plus the latest start 100 us x 2000 = 0.2 s
    spec, _, _ = load_checked(write(spec_dir, "{type: flows, flows: [{src: h1, dst: h5, size: 4MB},"
                                              " {src: h3, dst: h5, size: 2MB, start: 100us}]}"), [])
    assert spec.timeout == pytest.approx(DEFAULT_TIMEOUT_BASE_S + 10 * (0.96 + 0.2))


def fabric_emu(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "FABRIC_EMU_STATE_DIR": str(cwd / "state"), "COLUMNS": "120"}
    return subprocess.run([sys.executable, "-m", "fabric_emu", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("workload,expected", [
    ("{type: incast, receiver: h1, senders: [h2, h1], size: 1MB}",
     "error: exp.yaml: workload.senders.1: h1 is the receiver"),
    ("{type: flows, flows: [{src: h1, dst: h9, size: 1MB}]}",
     "error: exp.yaml: workload.flows.0.dst: unknown host 'h9'"),
])
def test_cli_exits_2_with_one_line_and_creates_nothing(spec_dir: Path, workload: str, expected: str):
    write(spec_dir, workload)
    before = set(os.listdir(spec_dir))
    r = fabric_emu(["run", "exp.yaml", "--out", "results"], spec_dir)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected), lines
    assert set(os.listdir(spec_dir)) == before


def test_show_prints_the_shipped_incast_and_flows():
    r = fabric_emu(["show", "experiments/incast.yaml"], REPO)
    assert r.returncode == 0, r.stderr
    assert "incast of 4MB x 1 from 7 senders to h1" in r.stdout and "h8" in r.stdout
    assert "4.48 s emulated" in r.stdout
    r = fabric_emu(["show", "experiments/flows.yaml"], REPO)
    assert r.returncode == 0, r.stderr
    assert "4 flows" in r.stdout and "100 us" in r.stdout and "0.4 s" in r.stdout  # 100 us x 4000
