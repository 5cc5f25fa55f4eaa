"""Changing the load-balancing mode during a run: by a scheduled event and with `fabric-emu lb`
from another terminal. The change reaches every leaf (barrier answered), and the port counters
show the traffic move: one uplink before, all four after."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from fabric_emu.fabric.events import RestError, rest_call
from fabric_emu.state.records import live_records
from tests.integration.fabric_checks import REPO, fabric_emu, only_run_dir, read_csv, read_json

pytestmark = [pytest.mark.root, pytest.mark.slow]

SPEC = """\
name: live-switch
topology: {{name: ls-4x2x1, kind: leaf-spine, spines: 4, leaves: 2, hosts_per_leaf: 1, dilation: 2000}}
load_balancing: ecmp
spray: {{entropies: 4}}   # the NICs rotate 4 source ports per QP; ECMP hashes them as one
events: {events}
workload:
  type: flows
  flows:
    - {{src: h1, dst: h2, size: {size}, start: 0us}}
seed: 1
"""


def uplink_bytes(run_dir) -> dict[str, int]:
    return {p["peer"]: int(p["tx_bytes"]) for p in read_csv(run_dir / "ports.csv")
            if p["switch"] == "leaf1" and p["kind"] == "fabric"}


def test_a_scheduled_switch_from_ecmp_to_spray_moves_the_traffic(tmp_path):
    spec = tmp_path / "live.yaml"
    # 16 MB take 1.3 ms at 100 Gb/s: the switch comes half-way through
    spec.write_text(SPEC.format(events="[{at: 650us, load_balancing: spray}]", size="16MB"))
    r = fabric_emu("run", str(spec), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = only_run_dir(tmp_path / "out", "live-switch")
    s = read_json(run_dir / "summary.json")
    assert s["status"] == "ok"
    (event,) = s["events"]
    assert event["ok"] and event["switch_errors"] == [] and event["applied_s"] < 1.0, event
    assert s["load_balancing_final"] == "spray"

    up = uplink_bytes(run_dir)
    total = sum(up.values())
    ecmp_path = max(up, key=up.get)
    # Before the switch the QP kept one uplink (ECMP hashed its 4 ports alike); after it each
    # uplink took a quarter: about 1/2 + 1/8 on the first path, 1/8 on each other one.
    assert 0.50 <= up[ecmp_path] / total <= 0.75, up
    for spine, sent in up.items():
        if spine != ecmp_path:
            assert 0.06 <= sent / total <= 0.20, up
    assert s["transport"]["retransmitted_packets"] == 0


def _live_record(timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        live = [rec for rec in live_records() if rec.controller_url]
        if live:
            return live[0]
        time.sleep(0.2)
    raise AssertionError("no running fabric appeared")


def test_fabric_emu_lb_switches_a_running_fabric(tmp_path):
    spec = tmp_path / "live.yaml"
    spec.write_text(SPEC.format(events="[]", size="48MB"))  # about 8 s of traffic at 2000x
    run = subprocess.Popen([sys.executable, "-m", "fabric_emu", "run", str(spec), "--out", str(tmp_path / "out")],
                           cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        rec = _live_record()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until traffic flows up some uplink
            try:
                state = rest_call(rec.controller_url)
            except RestError:
                state = {}
            if any(u["tx_bps"] > 1e6 for u in state.get("uplinks", {}).get("leaf1", {}).values()):
                break
            time.sleep(0.2)
        assert state["mode"] == "ecmp"
        show = fabric_emu("lb")
        assert show.returncode == 0 and "ecmp" in show.stdout, show.stdout + show.stderr
        switch = fabric_emu("lb", "spray")
        assert switch.returncode == 0, switch.stdout + switch.stderr
        assert "spray" in switch.stdout and "applied" in switch.stdout
        bad = fabric_emu("lb", "flowlet")
        assert bad.returncode == 2 and "flowlet" in bad.stderr, bad.stderr
        bad = fabric_emu("lb", "spray", "--set", "inactivity=30us")  # spray takes no parameters
        assert bad.returncode == 2 and "takes no parameters" in bad.stderr, bad.stderr
        dlb = fabric_emu("lb", "dlb", "--set", "inactivity=30us", "--set", "quality_window=10us")
        assert dlb.returncode == 0 and "dlb" in dlb.stdout, dlb.stdout + dlb.stderr
        state = rest_call(rec.controller_url)
        assert state["mode"] == "dlb" and state["changes"][-1]["params"] == {
            "inactivity": "30us", "quality_window": "10us"}
        back = fabric_emu("lb", "spray")
        assert back.returncode == 0, back.stdout + back.stderr
        out, _ = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.terminate()
            run.wait(timeout=60)
    assert run.returncode == 0, out
    run_dir = only_run_dir(tmp_path / "out", "live-switch")
    s = read_json(run_dir / "summary.json")
    assert [c["mode"] for c in s["load_balancing_changes"]] == ["spray", "dlb", "spray"]
    up = uplink_bytes(run_dir)
    assert all(b > 0.05 * sum(up.values()) for b in up.values()), up  # every uplink carried some


@pytest.mark.parametrize("mode", ["ecmp", "spray", "dlb"])
def test_the_ring_completes_when_an_uplink_fails_in_the_middle(tmp_path_factory, mode):
    """experiments/link-failure.yaml: leaf1-spine2 goes down 300 us in; every leaf is rerouted
    (the summary's failover), RC resends what was lost, and nothing uses the link afterwards."""
    from tests.integration.fabric_checks import run_shipped

    run_dir, r = run_shipped(tmp_path_factory, "link-failure", f"load_balancing={mode}")
    assert r.returncode == 0, r.stdout + r.stderr
    s = read_json(run_dir / "summary.json")
    assert s["status"] == "ok" and s["busbw_fraction"] > 0.5
    (failover,) = s["failover"]
    assert failover["rerouted"] and 0 < failover["failover_s"] < 2.0, failover
    ports = {(p["switch"], p["peer"]): int(p["tx_bytes"]) for p in read_csv(run_dir / "ports.csv")}
    # The cut comes 300 us into a ring of about 2 ms: what crossed the link before it is a
    # fraction of what the links that stayed up carried (under spray they would be equal).
    to_leaf1 = [ports[(f"spine{i}", "leaf1")] for i in (1, 3, 4)]
    assert ports[("spine2", "leaf1")] < 0.5 * max(to_leaf1), ports
    assert ports[("leaf1", "spine2")] < 0.5 * max(ports[("leaf1", f"spine{i}")] for i in (1, 3, 4)), ports
    t = s["transport"]
    assert t["delivered_fraction"] == 1.0
    assert s["fidelity"]["trusted"], s["fidelity"]


def test_a_link_slowed_down_mid_run_carries_the_flow_at_its_new_rate(tmp_path):
    spec = tmp_path / "rate.yaml"
    spec.write_text("""\
name: rate-change
topology: {name: ls-1x2x1, kind: leaf-spine, spines: 1, leaves: 2, hosts_per_leaf: 1, dilation: 2000}
events:
  - {at: 100us, link: leaf1-spine1, gbps: 25}
workload:
  type: flows
  flows:
    - {src: h1, dst: h2, size: 8MB, start: 0us}
seed: 1
""")
    r = fabric_emu("run", str(spec), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stdout + r.stderr
    s = read_json(only_run_dir(tmp_path / "out", "rate-change") / "summary.json")
    assert s["status"] == "ok" and s["events"][0]["ok"]
    # 100 us at 100 Gb/s (1.25 MB), the rest (6.75 MB) at 25 Gb/s: about 2.26 ms
    want = 100e-6 + (8e6 - 1.25e6) * 8 / 25e9
    assert 0.85 * want <= s["jct_fabric_s"] <= 1.2 * want, s["jct_fabric_s"]
    assert s["transport"]["retransmitted_packets"] == 0  # PFC held the excess, nothing was lost
