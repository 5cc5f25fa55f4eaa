"""Live view and Prometheus during a real run (experiments/incast.yaml): a real Prometheus server
(Debian's binary, run here on loopback with a temporary config and storage) scrapes the run's
exporter every second, and `fabric-emu top --json` attaches from another process. The final
scraped port transmit counters match ports.csv within 1%; top's last view during traffic is
within one refresh of it, and its view after traffic is ports.csv exactly."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

from fabric_emu.state.records import live_records
from tests.integration.fabric_checks import REPO, only_run_dir, read_csv, read_json

pytestmark = [pytest.mark.root, pytest.mark.slow]

PROMETHEUS = shutil.which("prometheus")
SCRAPE_S = 1
LINGER_S = 4  # the run serves its final metrics this long: several scrapes
CONFIG = """\
global: {{scrape_interval: {s}s, scrape_timeout: {s}s, evaluation_interval: 15s}}
scrape_configs:
  - job_name: fabric-emu
    static_configs: [{{targets: ["127.0.0.1:{port}"]}}]
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen) -> None:
    """Stop a process this test started (its own session: the whole group, by its id)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def prom_query(base: str, expr: str) -> list[dict]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return body["data"]["result"]


def wait_ready(base: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise AssertionError("prometheus did not become ready")


def top_json(run_id: str) -> dict | None:
    r = subprocess.run([sys.executable, "-m", "fabric_emu", "top", "--json", "--run", run_id],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    return json.loads(r.stdout) if r.returncode == 0 and r.stdout.strip() else None


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus is not installed (scripts/setup.sh installs it)")
def test_prometheus_and_top_agree_with_ports_csv(tmp_path):
    metrics_port, prom_port = free_port(), free_port()
    (tmp_path / "prometheus.yml").write_text(CONFIG.format(s=SCRAPE_S, port=metrics_port))
    prom = subprocess.Popen(
        [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=open(tmp_path / "prometheus.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
    run = None
    views: list[dict] = []
    try:
        base = f"http://127.0.0.1:{prom_port}"
        wait_ready(base)
        run = subprocess.Popen(
            [sys.executable, "-m", "fabric_emu", "run", str(REPO / "experiments" / "incast.yaml"),
             "--set", "workload.iterations=3",  # traffic long enough for several views of it
             "--out", str(tmp_path / "out"), "--metrics-port", str(metrics_port),
             "--metrics-linger", str(LINGER_S)],
            cwd=REPO, stdout=open(tmp_path / "run.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 120
        rec = None
        while rec is None and time.monotonic() < deadline and run.poll() is None:
            rec = next((r for r in live_records() if r.live_path and r.metrics_url), None)
            time.sleep(0.2)
        assert rec is not None, (tmp_path / "run.log").read_text()
        assert rec.metrics_url == f"http://127.0.0.1:{metrics_port}/metrics"
        while run.poll() is None and time.monotonic() < deadline + 120:  # top, attached, until the run ends
            view = top_json(rec.run_id)
            if view is not None:
                views.append(view)
        # The final values were served for LINGER_S after the results were written.
        run.wait(timeout=10)
        assert run.returncode == 0, (tmp_path / "run.log").read_text()
        run_dir = only_run_dir(tmp_path / "out", "incast")
        csv_tx = {(p["switch"], p["port"]): int(p["tx_bytes"]) for p in read_csv(run_dir / "ports.csv")}
        # Series went stale when the exporter stopped; their highest value is the last one.
        got = prom_query(base, "max_over_time(fabric_emu_port_transmit_bytes_total[5m])")
        prom_tx = {(s["metric"]["switch"], s["metric"]["port"]): float(s["value"][1]) for s in got}
        info = prom_query(base, 'max_over_time(fabric_emu_run_info{phase="done"}[5m])')
        pause = prom_query(base, 'max_over_time(fabric_emu_pfc_pause_frames_total{direction="tx",priority="3"}[5m])')
        qps = prom_query(base, "max_over_time(fabric_emu_qp_transmit_bytes_total[5m])")
    finally:
        for p in (run, prom):
            if p is not None:
                stop(p)

    assert set(prom_tx) == set(csv_tx)
    worst = max(abs(prom_tx[k] - v) / max(v, 1) for k, v in csv_tx.items())
    total_diff = abs(sum(prom_tx.values()) - sum(csv_tx.values())) / sum(csv_tx.values())
    print(f"prometheus vs ports.csv: worst port {worst:.4%}, total {total_diff:.4%} "
          f"({sum(prom_tx.values()):.0f} vs {sum(csv_tx.values())} bytes)")
    assert worst <= 0.01 and total_diff <= 0.01
    assert info and info[0]["metric"]["experiment"] == "incast"
    s = read_json(run_dir / "summary.json")
    assert sum(float(p["value"][1]) for p in pause) == s["switch"]["pause_tx"]
    assert len(qps) == 7 and all(float(q["value"][1]) > 12e6 for q in qps)  # 7 senders, 3 x 4 MB each

    # top: a view during traffic within one refresh of the end, and the final view exactly.
    during = [v for v in views if v["phase"] == "traffic" and v["baseline"]]
    done = [v for v in views if v["phase"] == "done"]
    assert during, [v["phase"] for v in views]
    last = during[-1]
    dilation = last["dilation"]
    for p in last["ports"]:
        csv = csv_tx[(p["switch"], str(p["port"]))]
        one_refresh = p["gbps"] * 1e9 / dilation / 8 * 3  # a refresh (1 s) and reading it, at line rate
        assert 0 <= csv - p["counters"]["tx_bytes"] <= one_refresh, (p["intf"], csv, p["counters"]["tx_bytes"])
    gap = sum(csv_tx.values()) - sum(p["counters"]["tx_bytes"] for p in last["ports"])
    print(f"top's last view during traffic: {gap} bytes ({gap / sum(csv_tx.values()):.2%}) short of ports.csv, "
          f"taken {last['emulated_s']:.1f} s after GO")
    # QP rates come from the engines' once-a-second files: the last view may follow the last packet,
    # so the claim is that some view while packets flowed showed a QP's rate.
    assert any(q["gbps"] > 0 for v in during for q in v["busiest_qps"]), [v["busiest_qps"] for v in during]
    assert last["load_balancing"] == "ecmp" and last["congestion_control"] == "none"
    if done:
        assert {(p["switch"], str(p["port"])): p["counters"]["tx_bytes"] for p in done[-1]["ports"]} == csv_tx
    busy = [v for v in during if any(q["gbps"] > 0 for q in v["busiest_qps"])]
    print(f"top: {len(views)} views, {len(during)} during traffic ({len(busy)} with a QP's rate), "
          f"{len(done)} after it")
