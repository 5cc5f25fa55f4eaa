"""The Python API against the command line on real runs: the quickstart run both ways gives the
same summary, a folder the command wrote loads as frames whose totals are its CSVs', and a
sweep folder loads as one frame."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pandas as pd
import pytest

from fabric_emu.api import Experiment, ProgressEvent, Results, Sweep, load
from tests.integration.fabric_checks import REPO, fabric_emu, only_run_dir, read_csv

pytestmark = [pytest.mark.root, pytest.mark.slow]

QUICKSTART = REPO / "experiments" / "quickstart.yaml"


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cli")
    r = fabric_emu("run", str(QUICKSTART), "--out", str(out))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    return only_run_dir(out, "quickstart")


@pytest.fixture(scope="module")
def api_run(tmp_path_factory) -> tuple[Results, list[ProgressEvent]]:
    events: list[ProgressEvent] = []
    results = Experiment.from_file(QUICKSTART).run(out=tmp_path_factory.mktemp("api"), progress=events.append,
                                                   quiet=True)
    return results, events


def test_api_run_gives_the_summary_the_command_does(cli_run, api_run):
    results, _ = api_run
    cli, api = load(cli_run).summary, results.summary
    assert api["status"] == cli["status"] == "ok"
    # pfc_reaction is there only when a pause was measured: the quickstart pauses in some runs only
    assert set(api) - {"pfc_reaction"} == set(cli) - {"pfc_reaction"}
    assert set(api["transport"]) == set(cli["transport"]) and set(api["switch"]) == set(cli["switch"])
    for key in ("experiment", "load_balancing", "workload", "ranks", "size_bytes", "dilation",
                "iterations_completed", "ecmp"):
        assert api[key] == cli[key], key
    # Measured figures: equal within run-to-run noise (a shared 2-core machine).
    assert api["busbw_fraction"] == pytest.approx(cli["busbw_fraction"], rel=0.10)
    assert api["jct_fabric_s"] == pytest.approx(cli["jct_fabric_s"], rel=0.12)
    assert api["switch"]["tx_packets"] == pytest.approx(cli["switch"]["tx_packets"], rel=0.02)
    assert api["transport"]["lost_packets"] == cli["transport"]["lost_packets"] == 0
    meta = results.metadata
    assert meta["command"][:3] == ["fabric-emu", "run", str(QUICKSTART)] and meta["status"] == "ok"


def test_progress_reports_every_phase(api_run):
    _, events = api_run
    phases = [e.phase for e in events]
    assert [p for i, p in enumerate(phases) if i == 0 or phases[i - 1] != p] == [
        "bring_up", "traffic", "tear_down", "results", "done"]
    fractions = [e.fraction for e in events if e.fraction is not None]
    assert fractions and all(0 <= f <= 1 for f in fractions) and max(fractions) > 0.5
    assert all(b.elapsed_s >= a.elapsed_s for a, b in zip(events, events[1:]))


def _numbers(rows: list[dict], col: str) -> list[float] | None:
    """The column's non-empty cells as numbers, or None if it is not a numeric column."""
    try:
        return [float(r[col]) for r in rows if r[col] not in ("", None)]
    except ValueError:
        return None


def test_frames_total_what_the_csv_files_hold(cli_run):
    results = load(cli_run)
    assert isinstance(results, Results)
    checked = 0
    for name, file in (("ports", "ports.csv"), ("flows", "flows.csv"), ("queues", "queues.csv"),
                       ("thresholds", "thresholds.csv"), ("rates", "rates.csv"), ("pauses", "pauses.csv")):
        frame = results.frame(name)
        if not (cli_run / file).is_file():
            assert frame.empty
            continue
        with open(cli_run / file, newline="") as f:
            rows = list(csv.DictReader(f))
        assert len(frame) == len(rows), name
        for col in rows[0] if rows else []:
            values = _numbers(rows, col)
            if values is None:
                assert ["" if pd.isna(v) else str(v) for v in frame[col]] == [r[col] for r in rows], (name, col)
                continue
            assert float(frame[col].sum()) == pytest.approx(math.fsum(values), rel=1e-9, abs=1e-9), (name, col)
            checked += 1
    assert checked > 50
    ports, flows, d = results.ports, results.flows, results.dilation
    assert ports["tx_bytes"].sum() > 0 and len(flows) == 8 and (flows["completion_fabric_us"] > 0).all()
    assert flows["start_fabric_us"].tolist() == pytest.approx((flows["start_s"] / d * 1e6).tolist())
    assert results.jobs.loc[0, "jct_fabric_s"] == results.summary["jct_fabric_s"]
    assert results.queues["t_fabric_us"].tolist() == pytest.approx((results.queues["t_s"] / d * 1e6).tolist(),
                                                                   abs=1e-3)


def test_a_sweep_folder_loads_as_one_frame(tmp_path):
    r = fabric_emu("sweep", str(QUICKSTART), "--over", "workload.size=1MB,2MB", "--set", "workload.iterations=1",
                   "--out", str(tmp_path))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    (sweep_dir,) = (tmp_path / "quickstart").glob("sweep-*")
    sweep = load(sweep_dir)
    assert isinstance(sweep, Sweep) and sweep.keys == ["workload.size"] and len(sweep.runs) == 2
    flows = sweep.frame("flows")
    assert len(flows) == 16 and list(flows.columns[:3]) == ["workload.size", "seed", "run_dir"]
    assert flows.groupby("workload.size")["bytes"].sum().to_dict() == {
        1_000_000: sum(int(f["bytes"]) for f in read_csv(sweep.runs[0].path / "flows.csv")),
        2_000_000: sum(int(f["bytes"]) for f in read_csv(sweep.runs[1].path / "flows.csv"))}
    summary = sweep.summary()
    runs = read_csv(sweep_dir / "runs.csv")
    assert summary["workload.size"].tolist() == [1_000_000, 2_000_000] and summary["seed"].tolist() == [1, 1]
    assert summary["jct_fabric_s"].tolist() == [float(row["jct_fabric_s"]) for row in runs]
    assert (summary["status"] == "ok").all()
