"""`fabric-emu sweep` end to end: a 2 x 2 grid of real quickstart runs, then `compare` on them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from statistics import fmean

import pytest

from fabric_emu.run.prepare import load_checked
from fabric_emu.spec.load import read_yaml
from tests.integration.fabric_checks import REPO, fabric_emu, leftovers, read_csv, read_json

pytestmark = [pytest.mark.root, pytest.mark.slow]

QUICKSTART = REPO / "experiments" / "quickstart.yaml"
SIZES = {"1MB": 1_000_000, "2MB": 2_000_000}
RUN_FILES = ("experiment.yaml", "metadata.json", "summary.json", "ports.csv", "flows.csv")


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    r = fabric_emu("sweep", str(QUICKSTART), "--over", f"workload.size={','.join(SIZES)}", "--seeds", "1-2",
                   "--set", "workload.iterations=1", "--out", str(out))
    (sweep_dir,) = (out / "quickstart").glob("sweep-*")
    return out, sweep_dir, r


def test_every_point_runs_with_every_seed(swept):
    out, sweep_dir, r = swept
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    runs = read_csv(sweep_dir / "runs.csv")
    assert [(row["point"], row["workload.size"], row["seed"]) for row in runs] == [
        ("1", "1MB", "1"), ("1", "1MB", "2"), ("2", "2MB", "1"), ("2", "2MB", "2")]
    assert {p.name for p in (out / "quickstart").iterdir()} == {sweep_dir.name} | {
        os.path.basename(row["run_dir"]) for row in runs}  # nothing else was created
    ports = {}
    for row in runs:
        run_dir = out / "quickstart" / os.path.basename(row["run_dir"])
        assert all((run_dir / f).is_file() for f in RUN_FILES), sorted(p.name for p in run_dir.iterdir())
        assert not list(run_dir.glob(".*tmp*"))
        s, meta = read_json(run_dir / "summary.json"), read_json(run_dir / "metadata.json")
        spec = read_yaml(run_dir / "experiment.yaml")
        # The run is the point: its spec, seed and status, and runs.csv holds what it measured.
        assert spec["workload"]["size"] == SIZES[row["workload.size"]] and spec["workload"]["iterations"] == 1
        assert meta["seed"] == int(row["seed"]) == spec["seed"]
        assert meta["command"][1:] == ["run", str(QUICKSTART), "--out", str(out), "--set", "workload.iterations=1",
                                       "--set", f"workload.size={row['workload.size']}", "--set", f"seed={row['seed']}"]
        assert s["status"] == row["status"] == "ok"
        assert float(row["jct_fabric_s"]) == s["jct_fabric_s"] and float(row["busbw_fraction"]) == s["busbw_fraction"]
        assert row["trusted"] == str(s["fidelity"]["trusted"])
        assert 0.5 < s["busbw_fraction"] <= 1.0
        ports[(row["point"], row["seed"])] = {f["udp_src"] for f in read_csv(run_dir / "flows.csv")}
    # The seed picks the queue pair numbers, hence the UDP source ports on the wire.
    assert ports[("1", "1")] != ports[("1", "2")] and ports[("1", "1")] == ports[("2", "1")]


def test_comparison_aggregates_the_runs_summaries(swept):
    _, sweep_dir, r = swept
    runs = read_csv(sweep_dir / "runs.csv")
    rows = read_csv(sweep_dir / "comparison.csv")
    assert [(row["point"], row["workload.size"], row["runs"], row["seeds"], row["ok"]) for row in rows] == [
        ("1", "1MB", "2", "2", "2"), ("2", "2MB", "2", "2", "2")]
    for row in rows:
        jcts = [float(x["jct_fabric_s"]) for x in runs if x["point"] == row["point"]]
        assert float(row["jct_fabric_s_mean"]) == pytest.approx(fmean(jcts))
        assert (float(row["jct_fabric_s_min"]), float(row["jct_fabric_s_max"])) == (min(jcts), max(jcts))
        assert int(row["trusted"]) == sum(x["trusted"] == "True" for x in runs if x["point"] == row["point"])
    # Twice the bytes through the same ring at the same rate: about twice the completion time.
    ratio = float(rows[1]["jct_fabric_s_mean"]) / float(rows[0]["jct_fabric_s_mean"])
    assert 1.6 < ratio < 2.4, ratio
    assert (sweep_dir / "comparison.png").read_bytes().startswith(b"\x89PNG")
    manifest = read_json(sweep_dir / "sweep.json")
    assert manifest["over"] == {"workload.size": list(SIZES)} and manifest["seeds"] == [1, 2]
    assert not list(sweep_dir.glob(".*tmp*"))
    assert "quickstart: 2 point(s) x 2 seed(s)" in r.stdout and f"sweep: {sweep_dir}" in r.stdout


def test_compare_prints_the_sweeps_table_again(swept):
    out, sweep_dir, r = swept
    again = fabric_emu("compare", str(sweep_dir))
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() and again.stdout in r.stdout  # the very table the sweep printed
    by_spec = fabric_emu("compare", *[str(out / "quickstart" / os.path.basename(row["run_dir"]))
                                      for row in read_csv(sweep_dir / "runs.csv")])
    assert by_spec.returncode == 0, by_spec.stderr
    assert "4 run(s) in 2 group(s)" in by_spec.stdout and "workload.size" in by_spec.stdout
    assert "1000000" in by_spec.stdout and "2000000" in by_spec.stdout  # as the resolved specs say


def test_ctrl_c_stops_the_sweep_after_tearing_down_the_run(tmp_path):
    sweep = subprocess.Popen([sys.executable, "-m", "fabric_emu", "sweep", str(QUICKSTART), "--out", str(tmp_path),
                              "--over", "workload.size=400MB,800MB"], cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": "200"})
    for line in sweep.stdout:
        if "traffic:" in line:
            break
    sweep.send_signal(signal.SIGINT)
    output = sweep.communicate(timeout=120)[0]
    assert sweep.returncode == 1, output
    assert "sweep interrupted after 1 of 2 runs" in output
    (sweep_dir,) = (tmp_path / "quickstart").glob("sweep-*")
    (row,) = read_csv(sweep_dir / "runs.csv")  # the second point never started
    assert row["status"] == "incomplete" and row["error"].startswith("interrupted")
    assert read_json(sweep_dir / "sweep.json")["interrupted"] is True
    assert read_json(tmp_path / "quickstart" / os.path.basename(row["run_dir"]) / "summary.json")["status"] == "incomplete"
    assert leftovers(load_checked(QUICKSTART, [])[1]) == []


def test_nothing_left_behind(swept):
    assert leftovers(load_checked(QUICKSTART, [])[1]) == []
