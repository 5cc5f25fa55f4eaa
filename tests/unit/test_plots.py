"""plots.write_plots draws PNGs from a results folder and skips what it has no data for."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from fabric_emu.results.plots import flow_rate_steps, write_plots
from fabric_emu.results.transport import arrival_curve

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
DILATION = 2000


def _csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _queues(per_class: bool) -> list[dict]:
    rows = []
    for i in range(50):
        t = i * 0.1
        for sw, port, peer, scale in (("leaf1", 3, "spine1", 300_000), ("spine1", 2, "leaf2", 120_000),
                                      ("leaf2", 1, "h3", 0)):
            depth = int(scale * (1 + math.sin(i / 5)) / 2)
            row = {"t_s": round(t, 4), "t_fabric_us": round(t / DILATION * 1e6, 3), "switch": sw,
                   "port": port, "peer": peer, "backlog_bytes": depth, "backlog_packets": depth // 4200}
            if per_class:
                row.update(p0_bytes=0, p3_bytes=depth, p6_bytes=0, paused=int(depth > 250_000))
            rows.append(row)
    return rows


def _agent(src: str, qpn: int, rate_bps: float) -> dict:
    t0 = 1_700_000_000.0
    series = [[t0 + i * 0.05, int(rate_bps / 8 * i * 0.05)] for i in range(40)]
    return {"recv_qps": [{"src": src, "qpn": qpn + 1, "remote_qpn": qpn, "bytes": series[-1][1],
                          "rx_series": series}]}


def _full_run(d: Path, per_class: bool = True) -> Path:
    _csv(d / "queues.csv", _queues(per_class))
    _csv(d / "pauses.csv", [
        {"node": "leaf1", "port": 1, "intf": "leaf1-eth1", "peer": "h1", "start_s": 0.5, "end_s": 0.9,
         "start_fabric_us": 250.0, "end_fabric_us": 450.0},
        {"node": "leaf1", "port": 1, "intf": "leaf1-eth1", "peer": "h1", "start_s": 1.5, "end_s": 1.5,
         "start_fabric_us": 750.0, "end_fabric_us": 750.0},  # zero length: still drawn
        {"node": "h2", "port": 0, "intf": "h2-eth0", "peer": "leaf1", "start_s": 1.0, "end_s": "",
         "start_fabric_us": 500.0, "end_fabric_us": ""},  # still paused when the run ended
    ])
    _csv(d / "rates.csv", [{"host": "h2", "qpn": 100, "dst": "h1", "flow": 0, "time_s": t / 1e3,
                            "time_fabric_us": t, "rate_gbps": r}
                           for t, r in ((10, 50.0), (20, 25.0), (40, 37.5), (80, 100.0))])
    (d / "agents").mkdir()
    (d / "agents" / "h1.json").write_text(json.dumps(_agent("h2", 100, 45e6)))
    (d / "agents" / "h2.json").write_text(json.dumps(_agent("h1", 200, 25e6)))
    (d / "summary.json").write_text(json.dumps({"dilation": DILATION, "host_link_gbps": 100,
                                                "switch": {"pause_tx": 12}}))
    (d / "experiment.yaml").write_text("name: x\necn: {enabled: true, kmin: 100000, kmax: 400KB}\n"
                                       "pfc: {enabled: true, xoff: 200000}\n")
    return d


def _is_png(p: Path) -> bool:
    data = p.read_bytes()
    return data[:8] == PNG_MAGIC and len(data) > 5000


def test_writes_every_plot(tmp_path: Path):
    written = write_plots(_full_run(tmp_path))
    assert [p.name for p in written] == ["queue_depth.png", "pauses.png", "flow_rates.png",
                                         "dcqcn_rates.png"]
    for p in written:
        assert p.parent == tmp_path / "plots" and _is_png(p)
    assert not [f for f in (tmp_path / "plots").iterdir() if f.name.startswith(".")]  # no temp files


def test_queue_depth_without_per_class_columns_uses_total_backlog(tmp_path: Path):
    _csv(tmp_path / "queues.csv", _queues(per_class=False))
    assert [p.name for p in write_plots(tmp_path)] == ["queue_depth.png"]
    assert _is_png(tmp_path / "plots" / "queue_depth.png")


def test_empty_folder_writes_nothing(tmp_path: Path):
    assert write_plots(tmp_path) == []
    assert not (tmp_path / "plots").exists()
    assert write_plots(tmp_path / "absent") == []


@pytest.mark.parametrize("content", ["", "t_s,t_fabric_us,switch,port,peer,backlog_bytes,backlog_packets\n",
                                     "not,a\n\x00garbage"])
def test_empty_or_broken_inputs_skip_their_plot(tmp_path: Path, content: str):
    _full_run(tmp_path)
    for name in ("queues.csv", "pauses.csv", "rates.csv"):
        (tmp_path / name).write_text(content)
    (tmp_path / "agents" / "h1.json").write_text(content)
    (tmp_path / "agents" / "h2.json").write_text(json.dumps({"recv_qps": [{"src": "h1", "rx_series": []}]}))
    assert write_plots(tmp_path) == []


def test_missing_side_files_only_lose_their_decorations(tmp_path: Path):
    _full_run(tmp_path)
    (tmp_path / "summary.json").unlink()  # no dilation (taken as 1), no pause count
    (tmp_path / "experiment.yaml").write_text(": not yaml [")
    assert len(write_plots(tmp_path)) == 4


def test_rerun_replaces_plots(tmp_path: Path):
    _full_run(tmp_path)
    first = write_plots(tmp_path)
    assert write_plots(tmp_path) == first


def test_flow_rates_never_exceed_the_link_and_keep_every_byte(tmp_path: Path):
    """A receive engine reads late batches at once: 150 KB in 1 ms of emulated time is 4,800
    Gb/s modelled at this dilation, on a 100 Gb/s link (issue 21 saw 185 Gb/s). The curve spreads
    such a batch back over the time the link needed, and loses no byte doing it."""
    link_gbps, t0 = 100, 1_700_000_000.0
    series = [[t0, 0], [t0 + 0.05, 100_000], [t0 + 0.051, 250_000], [t0 + 0.10, 300_000]]
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "h1.json").write_text(json.dumps(
        {"recv_qps": [{"src": "h2", "qpn": 11, "remote_qpn": 10, "rx_series": series}]}))
    (tmp_path / "summary.json").write_text(json.dumps({"dilation": DILATION, "host_link_gbps": link_gbps}))
    (label, xs, ys), = flow_rate_steps(tmp_path)[0]
    assert label == "h2\u2192h1 qp10"
    assert max(ys) <= link_gbps * (1 + 1e-9), ys
    assert max(ys) == pytest.approx(link_gbps)  # the burst runs at the link rate, not below it
    # The area under the steps (modelled Gb/s x modelled us) is every byte received.
    area = sum(y * (xb - xa) for y, xa, xb in zip(ys[1:], xs, xs[1:]))
    assert area * 1e3 / 8 == pytest.approx(300_000)
    assert xs[:2] == [0.0, pytest.approx(xs[1])] and xs[1] > 0  # the first read found bytes that started before it


def test_arrival_curve_leaves_a_curve_the_link_could_carry_alone():
    steady = [(i * 0.5, i * 100.0) for i in range(10)]  # 200 B/s on a 250 B/s link
    assert arrival_curve(steady, 250.0) == steady
