"""PFC deadlocks through `fabric-emu run experiments/deadlock-ring.yaml`: judged on what the
NICs sent and received, the switches' lossless counters, and the detector's report.

The ring: four switches, a host on each, every flow pinned two hops clockwise at line rate, so
each ring link is 2:1 oversubscribed and the four ring buffers close a cycle of pauses.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.fabric_checks import read_csv, read_json, run_shipped

pytestmark = [pytest.mark.root, pytest.mark.slow]

DETECTION_S = 400e-6  # the classroom watchdog's detection time: the detector's persistence too
CYCLE = "r1.in(r4) -> r2.in(r1) -> r3.in(r2) -> r4.in(r3)"
COUNTER_CLOCKWISE = ("paths=[{src: h1, dst: h3, via: [r1, r2, r3]}, {src: h2, dst: h4, via: [r2, r1, r4]}, "
                     "{src: h3, dst: h1, via: [r3, r4, r1]}, {src: h4, dst: h2, via: [r4, r3, r2]}]")


def quiet_s(run: Path) -> tuple[float, float]:
    """(modelled seconds from the last frame any NIC sent or received to the end of the run,
    the same from the last frame received)."""
    dilation = read_json(run / "summary.json")["dilation"]
    last_tx, last_rx, end, go = 0.0, 0.0, 0.0, None
    for f in (run / "agents").glob("h*.json"):
        a = read_json(f)
        go = a["go"] if go is None else min(go, a["go"])
        end = max(end, a["end"])
        last_tx = max([last_tx] + [q["last_tx"] for q in a["send_qps"] if q.get("last_tx")])
        last_rx = max([last_rx] + [q["last_rx"] for q in a["recv_qps"] if q.get("last_rx")])
    return (end - max(last_tx, last_rx)) / dilation, (end - last_rx) / dilation


@pytest.fixture(scope="module")
def ring(tmp_path_factory):
    return run_shipped(tmp_path_factory, "deadlock-ring", "timeout=20s")


def test_the_ring_locks_for_good_and_loses_nothing(ring):
    run, r = ring
    s = read_json(run / "summary.json")
    assert s["status"] == "incomplete", r.stdout[-2000:]
    # each flow got ~150 KB of its 16 MB through
    assert sum(f["bytes_received"] for f in s["flows"]) < 0.05 * sum(f["bytes_planned"] for f in s["flows"])
    quiet, no_goodput = quiet_s(run)
    # Nothing moved, sent or received, for at least ten watchdog detection times before the end.
    assert quiet >= 10 * DETECTION_S and no_goodput >= 10 * DETECTION_S, (quiet, no_goodput)
    assert s["switch"]["lossless_drops"] == 0 and s["transport"]["retransmitted_packets"] == 0
    dl = s["deadlocks"]
    assert [p["cycle"] for p in dl["persistent"]] == [CYCLE] and dl["deadlocked_at_end"]
    assert dl["persistent"][0]["longest_s"] >= 10 * DETECTION_S and dl["persistent"][0]["formations"] == 1
    (row,) = read_csv(run / "deadlocks.csv")
    assert row["cycle"] == CYCLE and row["broken_s"] == "" and int(row["max_bytes"]) > 100_000
    # Lost nothing: what was not delivered is held in the paused buffers, and said so.
    assert not any("lost where no switch counter" in w for w in s["fidelity"]["warnings"])
    assert any("PFC deadlock" in n for n in s["fidelity"]["notes"])
    assert (run / "plots" / "deadlock.png").stat().st_size > 10_000


@pytest.mark.parametrize("sets", [(COUNTER_CLOCKWISE,), ("topology.host_link.gbps=45",)], ids=["ccw", "45pct"])
def test_the_controls_deliver_every_byte_and_never_lock(tmp_path_factory, sets):
    run, r = run_shipped(tmp_path_factory, "deadlock-ring", *sets)
    s = read_json(run / "summary.json")
    assert s["status"] == "ok", r.stdout[-2000:]
    assert all(f["bytes_received"] == f["bytes_planned"] for f in s["flows"])
    assert s["switch"]["lossless_drops"] == 0
    assert s["deadlocks"]["persistent"] == [] and not s["deadlocks"]["deadlocked_at_end"]


def test_the_watchdog_breaks_it_and_it_forms_again(tmp_path_factory):
    # A retransmission timeout of 262 us (not RoCE's default 4.2 ms): a flow the drops cost its
    # tail is back within a period, so the cycle keeps forming (5 formations in 6 ms, measured).
    # Each formation waits for the watchdog, so the flows finish in 3-30 s here; a CI rehearsal
    # once reached 25 s with the cycle formed and ended deadlocked: 45 s leaves room.
    run, r = run_shipped(tmp_path_factory, "deadlock-ring", "pfcwd.enabled=true", "timeout=45s",
                         "transport.retransmit_timeout=262.144us")
    s = read_json(run / "summary.json")
    dl, wd = s["deadlocks"], s["pfcwd"]
    (p,) = dl["persistent"]
    assert p["cycle"] == CYCLE and p["formations"] >= 3 and p["period_s"] > 0, dl
    assert not dl["deadlocked_at_end"]
    # broken by the watchdog's drop action, whose drops are counted
    assert wd["storms_detected"] >= 2 and wd["tx_dropped_packets"] > 0
    assert any(e.get("label") == "deadlock member" for e in wd["episodes"])
    assert sum(f["bytes_received"] for f in s["flows"]) > 4 * 1_000_000  # it moved again


BOUNCE = ("leaf1.in(spine3) -> spine2.in(leaf1) -> leaf4.in(spine2) -> spine1.in(leaf4) -> "
          "leaf3.in(spine1) -> spine3.in(leaf3)")


def test_local_reroute_bounces_flows_into_a_six_buffer_deadlock(tmp_path_factory):
    run, r = run_shipped(tmp_path_factory, "deadlock-bounce", "timeout=10s")
    s = read_json(run / "summary.json")
    dl = s["deadlocks"]
    assert [p["cycle"] for p in dl["persistent"]] == [BOUNCE] and dl["deadlocked_at_end"], dl
    assert dl["persistent"][0]["length"] == 6
    # the switches detoured on their own, as their ports went down
    assert [f["mode"] for f in s["failover"]] == ["local"] * 3 and all(f["rerouted"] for f in s["failover"])
    assert s["switch"]["lossless_drops"] == 0


def test_global_failover_reroutes_around_the_same_failures_without_a_cycle(tmp_path_factory):
    run, r = run_shipped(tmp_path_factory, "deadlock-bounce", "failover=global", "timeout=60s")
    s = read_json(run / "summary.json")
    assert s["status"] == "ok", r.stdout[-2000:]
    assert s["deadlocks"]["cycles_seen"] == 0
    assert all(f["bytes_received"] == f["bytes_planned"] for f in s["flows"])
    assert [f["mode"] for f in s["failover"]] == ["global"] * 3 and all(f["rerouted"] for f in s["failover"])


@pytest.mark.parametrize("gbps, deadlock", [(1, False), (10, True)])
def test_a_routing_loop_kills_packets_by_ttl_and_deadlocks_above_a_rate(tmp_path_factory, gbps, deadlock):
    run, r = run_shipped(tmp_path_factory, "routing-loop", f"topology.host_link.gbps={gbps}", "timeout=8s")
    s = read_json(run / "summary.json")
    ports = read_csv(run / "ports.csv")
    expired = sum(int(p["ttl_expired"]) for p in ports)
    if deadlock:
        assert s["deadlocks"]["deadlocked_at_end"], s["deadlocks"]
        assert all(p["length"] == 2 for p in s["deadlocks"]["persistent"])  # a leaf and a spine
    else:
        # packets for the cut-off leaf died of old age, at the switches that saw them last
        assert expired > 0 and s["deadlocks"]["persistent"] == [], (expired, s["deadlocks"])
        assert s["switch"]["drops"] >= expired
    # An expired packet dies in Open vSwitch's table 0; its ingress port's program does not charge
    # it (it stayed charged, in no queue, for good until issue 20), so no port the loop runs through
    # leaks. What still may: an ACK from h5 or h6, which Open vSwitch drops at leaf3 inside its
    # fast-failover group with no live uplink, where no program sees it (62 B measured, once).
    acc = s["pfc_accounting"]
    assert acc["settled"] and acc["over_credited_bytes"] == 0, acc
    assert set(acc["leaked_by_port"]) <= {"leaf3-eth1", "leaf3-eth2"}, acc
    assert acc["leaked_bytes"] + acc["queued_bytes"] == acc["held_bytes"]
