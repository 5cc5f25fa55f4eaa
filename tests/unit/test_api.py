"""fabric_emu.api without a fabric: experiments from files and dicts with the CLI's errors,
overrides, load() of folders, and frames read from CSVs written by the runner's own writers."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from fabric_emu.cc.pfcwd import Timers
from fabric_emu.ports.watchdog import PortWatchdogs
from fabric_emu.results.pfcwd import pfcwd_rows
from fabric_emu.api import FRAME_NAMES, Experiment, Results, SpecError, Sweep, load
from fabric_emu.api.frames import DTYPES, FRAMES
from fabric_emu.measure.counters import PortCounters
from fabric_emu.results import folder
from fabric_emu.results.switch import pause_rows
from fabric_emu.results.transport import flow_rows, rate_rows
from fabric_emu.spec.load import load_experiment, resolved_dict
from fabric_emu.topo.plan import build_plan
from tests.unit.test_flows_summary import incast_agents

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "experiments" / "quickstart.yaml"
D = 2000.0
TOPO = {"name": "t", "kind": "leaf-spine", "spines": 2, "leaves": 2, "hosts_per_leaf": 2, "dilation": D}


def test_a_bad_dict_raises_the_cli_error_naming_the_field():
    with pytest.raises(SpecError) as e:
        Experiment.from_dict({"name": "x", "topology": TOPO, "workload": {"type": "allreduce", "size": "lots"}},
                             name_for_errors="my-sweep")
    assert e.value.problems == [("my-sweep", "workload.size",
                                 "got 'lots' (a byte count or a size such as 64KB, 8MB, 1GiB)")]
    assert str(e.value) == "my-sweep: workload.size: got 'lots' (a byte count or a size such as 64KB, 8MB, 1GiB)"
    with pytest.raises(SpecError, match=r"<dict>: topology\.spines: Input should be greater than or equal to 1"):
        Experiment.from_dict({"name": "x", "topology": {**TOPO, "spines": 0}, "workload": {"type": "allreduce"}})
    with pytest.raises(SpecError, match=r"<dict>: workload\.ranks: unknown host 'h9'"):  # a plan check
        Experiment.from_dict({"name": "x", "topology": TOPO, "workload": {"type": "allreduce", "size": "1MB", "ranks": ["h1", "h9"]}})


def test_the_file_and_its_dict_are_the_same_experiment():
    from_file = Experiment.from_file(QUICKSTART)
    data = {"name": "quickstart", "topology": "../topologies/ls-2x4x2.yaml",
            "workload": {"type": "allreduce", "size": "8MB", "iterations": 2}}
    from_dict = Experiment.from_dict(data, base_dir=QUICKSTART.parent)
    assert resolved_dict(from_dict.spec) == resolved_dict(from_file.spec)
    assert from_dict.ranks == from_file.ranks and from_dict.dilation == from_file.dilation
    assert data["topology"] == "../topologies/ls-2x4x2.yaml"  # the caller's dict is left alone


def test_overrides_are_set_overrides():
    base = Experiment.from_file(QUICKSTART)
    exp = base.override("workload.size=1MB", {"seed": 7, "workload.iterations": 1, "load_balancing": "spray"})
    assert (exp.spec.workload.size, exp.spec.seed, exp.spec.workload.iterations, exp.spec.load_balancing) == (
        1_000_000, 7, 1, "spray")
    assert exp.sets == ["workload.size=1MB", "seed=7", "workload.iterations=1", "load_balancing=spray"]
    assert base.spec.seed == 1 and base.sets == []  # a new experiment; the old one is unchanged
    assert exp.command("out")[-8:] == ["--set", "workload.size=1MB", "--set", "seed=7", "--set",
                                       "workload.iterations=1", "--set", "load_balancing=spray"]
    cli = subprocess.run([sys.executable, "-m", "fabric_emu", "show", str(QUICKSTART), "--set", "workload.sise=3"],
                         capture_output=True, text=True, cwd=REPO)
    with pytest.raises(SpecError) as e:
        base.override({"workload.sise": 3})
    assert cli.returncode == 2 and cli.stderr.strip() == f"error: {e.value}"


def test_run_needs_root(monkeypatch):
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    with pytest.raises(PermissionError, match="needs root"):
        Experiment.from_file(QUICKSTART).run()


def test_load_says_what_is_not_a_results_folder(tmp_path):
    with pytest.raises(SpecError, match="not a results folder .allowed: a run's folder with summary.json"):
        load(tmp_path)
    with pytest.raises(SpecError, match="not found"):
        load(tmp_path / "nowhere")
    with pytest.raises(SpecError, match="has no summary.json"):
        Results(tmp_path)


def _run_folder(base: Path, seed: int = 1, size: str = "1MB") -> Path:
    """A results folder as the runner writes one, from its own row builders and writers."""
    spec = load_experiment(REPO / "experiments" / "incast.yaml", [f"seed={seed}", f"workload.size={size}"])
    plan = build_plan(spec.topology, dilation=D)
    run_dir = folder.make_run_dir(base, spec.name, 1e9 + seed)
    agents = incast_agents()
    agents["h2"]["send_qps"][0]["rates"] = [(100.2, 50e9), (100.4, 75e9)]
    ports = [PortCounters("leaf1", 1, "leaf1-eth1", "h1", "host", tx_bytes=1000 * seed, paused_ns_p3=4_000_000),
             PortCounters("leaf1", 3, "leaf1-eth3", "spine1", "fabric", tx_bytes=500)]
    intf = plan.links[0].a_intf
    folder.write_yaml(run_dir / "experiment.yaml", resolved_dict(spec))
    folder.write_json(run_dir / "summary.json", {"status": "ok", "experiment": spec.name, "workload": "incast",
                                                 "ranks": 3, "dilation": D, "jct_s": 2.5, "jct_fabric_s": 2.5 / D,
                                                 "transport": {"cnp_sent": 4}, "per_flow": [1, 2]})
    folder.write_csv(run_dir / "ports.csv", [p.row(D) for p in ports])
    folder.write_csv(run_dir / "flows.csv", flow_rows(plan, agents))
    folder.write_csv(run_dir / "rates.csv", rate_rows(agents, D))
    folder.write_csv(run_dir / "pauses.csv", pause_rows(plan, {"intervals": {intf: [(10.0, 10.5), (11.0, None)]}}, 9.0))
    folder.write_csv(run_dir / "queues.csv", [
        {"t_s": 0.1, "t_fabric_us": 0.1 / D * 1e6, "switch": "leaf1", "port": 1, "peer": "h1", "backlog_bytes": 9000,
         "p0_bytes": 0, "p3_bytes": 8000, "p6_bytes": 1000, "paused": 1}])
    folder.write_csv(run_dir / "thresholds.csv", [
        {"switch": "leaf1", "port": 1, "intf": "leaf1-eth1", "limit_p0": 1, "limit_p3": 2, "limit_p6": 3, "ecn": True,
         "kmin": 10, "kmax": 20, "pmax": 0.2, "pfc": False, "xoff": 30, "xon": 25, "headroom": 40}])
    watchdog = PortWatchdogs(Timers(400_000, 800_000, 200_000), {7: ("leaf1-eth1", "leaf1")}, _Table(), D)
    folder.write_csv(run_dir / "pfcwd.csv", pfcwd_rows({"watchdog": watchdog.report()}))
    return run_dir


class _Table:
    def get(self, *_) -> int:
        return 3

    def set(self, *_) -> None:
        pass


def test_frames_have_their_documented_columns_and_types(tmp_path):
    results = load(_run_folder(tmp_path))
    assert isinstance(results, Results) and results.dilation == D and results.seed == 1
    for name in FRAME_NAMES:
        frame, columns = results.frame(name), FRAMES[name][1]
        assert list(frame.columns) == [c.name for c in columns], name
        assert len(frame) > 0, name
        for c in columns:
            assert str(frame[c.name].dtype) == str(pd.Series([], dtype=DTYPES[c.kind]).dtype), (name, c.name)
    ports, flows, pauses, rates = results.ports, results.flows, results.pauses, results.rates
    assert ports["tx_bytes"].sum() == 1500 and ports.loc[0, "paused_fabric_us_p3"] == pytest.approx(2.0)
    assert ports.loc[0, "paused_s_p3"] == pytest.approx(0.004)  # 2 modelled us x 2000
    assert flows["completion_s"].tolist() == [1.0, 2.0] and flows["flow"].tolist() == [0, 1]
    assert flows["start_fabric_us"].tolist() == [0.0, pytest.approx(0.5 / D * 1e6)]
    assert pauses["duration_s"].tolist()[0] == pytest.approx(0.5) and pd.isna(pauses["end_s"].iloc[1])
    assert rates["rate_gbps"].tolist() == [50.0, 75.0] and rates["time_s"].tolist() == pytest.approx([0.2, 0.4])
    assert results.queues["paused"].tolist() == [True] and results.thresholds["ecn"].tolist() == [True]
    assert results.pfcwd["queue"].tolist() == ["leaf1-eth1:3"] and results.pfcwd["status"].tolist() == ["operational"]
    jobs = results.jobs
    assert len(jobs) == 1 and jobs.loc[0, "jct_fabric_s"] == 2.5 / D and jobs.loc[0, "type"] == "incast"
    assert results.scalars() == {"status": "ok", "experiment": "incast", "workload": "incast", "ranks": 3,
                                 "dilation": D, "jct_s": 2.5, "jct_fabric_s": 2.5 / D, "transport.cnp_sent": 4}


def test_a_missing_file_is_an_empty_frame_with_the_columns(tmp_path):
    run_dir = _run_folder(tmp_path)
    (run_dir / "pauses.csv").unlink()
    (run_dir / "rates.csv").write_text("")
    results = Results(run_dir)
    for name in ("pauses", "rates"):
        frame = results.frame(name)
        assert frame.empty and list(frame.columns) == [c.name for c in FRAMES[name][1]]
    with pytest.raises(ValueError, match="no frame 'flow'; allowed: ports, flows"):
        results.frame("flow")


def test_runs_concatenate_keyed_by_the_swept_values_and_seed(tmp_path):
    runs = [Results(_run_folder(tmp_path, seed, size)) for size in ("1MB", "2MB") for seed in (1, 2)]
    sweep = Sweep(runs, ["workload.size"])
    ports = sweep.frame("ports")
    assert list(ports.columns[:3]) == ["workload.size", "seed", "run_dir"] and len(ports) == 8
    assert ports.groupby("seed")["tx_bytes"].sum().to_dict() == {1: 2 * 1500, 2: 2 * 2500}
    summary = sweep.summary()
    assert summary[["workload.size", "seed"]].values.tolist() == [[1_000_000, 1], [1_000_000, 2],
                                                                  [2_000_000, 1], [2_000_000, 2]]
    assert summary["transport.cnp_sent"].tolist() == [4] * 4


def test_python_api_doc_lists_every_column():
    doc = (REPO / "docs" / "python-api.md").read_text()
    for name, (_, columns) in FRAMES.items():
        section = re.search(rf"^### `{name}`\n(.*?)(?=^#|\Z)", doc, re.S | re.M)
        assert section, name
        listed = re.findall(r"^\| `([A-Za-z0-9_]+)` \|", section.group(1), re.M)
        assert listed == [c.name for c in columns], name


def test_importing_the_api_does_not_import_pandas():
    code = "import sys, fabric_emu.api, fabric_emu.cli; assert 'pandas' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0
