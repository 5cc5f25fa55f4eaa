"""Incast and flows end to end through `fabric-emu run`: judged on what the run measured.

Both runs use an 8 MB port buffer, so the tail-drop queues never overflow, and PFC thresholds
above any backlog they build, so PFC stays idle: these tests are about the workloads (every
byte sent arrives, goodputs below the link, fairness) and the results they write.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from fabric_emu.run.prepare import load_checked
from tests.integration.fabric_checks import REPO, leftovers, read_csv, read_json, run_shipped

pytestmark = [pytest.mark.root, pytest.mark.slow]

NO_LOSS = ("topology.port_buffer=8MB", "pfc.xoff=7MB", "pfc.xon=6MB", "congestion_control=none")
LINK_GBPS = 100.0  # host links of both shipped experiments


def run(tmp_path_factory, name: str) -> tuple[Path, subprocess.CompletedProcess]:
    return run_shipped(tmp_path_factory, name, *NO_LOSS)


@pytest.fixture(scope="module")
def incast(tmp_path_factory):
    return run_shipped(tmp_path_factory, "incast", *NO_LOSS, "workload.size=1MB")


@pytest.fixture(scope="module")
def flows(tmp_path_factory):
    return run(tmp_path_factory, "flows")


def check_delivery(s: dict, n_flows: int) -> None:
    assert s["status"] == "ok", s.get("error")
    assert s["transport"]["retransmitted_packets"] == 0
    assert s["switch"]["drops"] == 0 and s["transport"]["lost_packets"] == 0
    assert s["transport"]["delivered_fraction"] == 1.0
    assert s["transport"]["bytes_received"] == s["bytes_planned"]
    assert len(s["flows"]) == n_flows
    for f in s["flows"]:
        assert f["bytes_received"] == f["bytes_sent"] == f["bytes_planned"], f
        assert 0 < f["goodput_gbps"] < LINK_GBPS, f  # payload can never beat the link
    assert 0 < s["jain_fairness"] <= 1


def test_incast_delivers_everything_at_the_receiver_link_rate(incast):
    run_dir, r = incast
    assert r.returncode == 0, r.stdout + r.stderr
    s = read_json(run_dir / "summary.json")
    check_delivery(s, 7)
    assert s["workload"] == "incast" and s["ranks"] == 8 and s["bytes_planned"] == 7_000_000
    # h1's link carries all 7 MB: the incast cannot finish faster than that, nor much slower
    assert s["jct_fabric_s"] >= 7e6 * 8 / (LINK_GBPS * 1e9)
    assert 0.6 <= s["receiver_link_fraction"] <= 1.0, s
    assert "Jain fairness" in r.stdout and "h8 > h1" in r.stdout


def test_incast_flows_csv_and_receive_series(incast):
    run_dir, _ = incast
    rows = read_csv(run_dir / "flows.csv")
    assert sorted(int(f["flow"]) for f in rows) == list(range(7))
    for f in rows:
        assert f["dst"] == "h1" and f["rx_bytes"] == f["bytes"] == "1000000"
        assert 0 < float(f["goodput_gbps"]) < LINK_GBPS
        assert float(f["completion_fabric_us"]) == pytest.approx(float(f["completion_s"]) / 2000 * 1e6)
        assert 0 <= float(f["start_s"]) < 0.05  # all start at GO
    h1 = json.loads((run_dir / "agents" / "h1.json").read_text())
    assert h1["status"] == "ok" and len(h1["recv_qps"]) == 7
    for q in h1["recv_qps"]:
        series = q["rx_series"]
        assert len(series) >= 3 and series[0][1] == 0 and series[-1] == [q["last_rx"], q["bytes"]]
        times = [t for t, _ in series]
        assert all(b - a >= 0.05 for a, b in zip(times[:-2], times[1:-1]))  # at most every 50 ms
        assert all(b1 <= b2 for (_, b1), (_, b2) in zip(series, series[1:]))


def test_flows_start_on_time_and_share_the_receiver(flows):
    run_dir, r = flows
    assert r.returncode == 0, r.stdout + r.stderr
    s = read_json(run_dir / "summary.json")
    check_delivery(s, 4)
    # only the hosts of the workload ran an agent
    assert sorted(p.stem for p in (run_dir / "agents").glob("*.json")) == ["h1", "h2", "h3", "h5", "h6", "h7"]
    f = s["flows"]
    # starts are modelled time x dilation after GO (a few ms of emulated slack = a few us)
    for k, start_us in ((0, 0), (1, 100), (2, 200), (3, 0)):
        assert start_us <= f[k]["start_fabric_us"] <= start_us + 15, f[k]
    # h6 -> h1 meets no other flow: near the link rate
    assert f[3]["goodput_gbps"] >= 0.6 * LINK_GBPS
    # h1 -> h5 and h3 -> h5 share h5's link: together they cannot beat it
    end = max(f[k]["start_s"] + f[k]["completion_s"] for k in (0, 1))
    assert (f[0]["bytes_received"] + f[1]["bytes_received"]) * 8 / end * 2000 / 1e9 <= LINK_GBPS
    rows = read_csv(run_dir / "flows.csv")
    assert sorted(int(row["flow"]) for row in rows) == [0, 1, 2, 2, 3]  # flow 2 has 2 QPs


def test_nothing_left_behind(incast, flows):
    _, plan, _ = load_checked(REPO / "experiments" / "flows.yaml", [])
    assert leftovers(plan) == []
