"""The controller crashes mid-run (issue 20, part 1): real Mininet, OVS, os-ken and NIC engines.

While a run goes on, this module reads the switches' own tables and port counters with
ovs-ofctl (a thread, every SAMPLE_S), so what it asserts is what Open vSwitch measured: the
fabric kept forwarding while the controller was away (fail_mode secure), the new controller
deleted nothing (an untouched flow keeps its age and its packet count), and a link cut after the
restart is still routed around (its uplink stops, the others carry on).
"""

from __future__ import annotations

import csv
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabric_emu.measure import sampling
from fabric_emu.state.records import live_records
from tests.integration.fabric_checks import REPO, fabric_emu, only_run_dir, read_json

pytestmark = [pytest.mark.root, pytest.mark.slow]

SAMPLE_S = 0.5
OFCTL = ["ovs-ofctl", "-O", "OpenFlow15"]


class Sampler(sampling.Sampler):
    """ovs-ofctl readings of one bridge while the run goes on: (time, flows), (time, port tx)."""

    interval_s = SAMPLE_S

    def __init__(self, bridge: str):
        self.bridge = bridge
        self.flows: list[tuple[float, dict]] = []
        self.ports: list[tuple[float, dict[int, int]]] = []

    def ticks(self) -> Iterator[None]:
        while True:
            yield  # the first sample after one interval, as the phase has started by then
            t = time.time()
            flows = subprocess.run([*OFCTL, "dump-flows", self.bridge], capture_output=True, text=True).stdout
            ports = subprocess.run([*OFCTL, "dump-ports", self.bridge], capture_output=True, text=True).stdout
            if "duration=" in flows:
                self.flows.append((t, parse_flows(flows)))
            if "port" in ports:
                self.ports.append((t, parse_port_tx(ports)))


def parse_flows(text: str) -> dict[str, tuple[float, int]]:
    """flow (table, priority and match, as ovs-ofctl prints them) -> (duration s, n_packets)."""
    out = {}
    for line in text.splitlines():
        m = re.search(r"duration=([\d.]+)s, table=(\d+), n_packets=(\d+), .*?priority=(\d+)([^ ]*) actions=", line)
        if m:
            out[f"table={m[2]},priority={m[4]}{m[5]}"] = (float(m[1]), int(m[3]))
    return out


def parse_port_tx(text: str) -> dict[int, int | None]:
    """port number -> tx packets (None: Open vSwitch has no figure, as for a port that is down,
    or every port while the fabric is torn down: those samples are left out)."""
    out, port = {}, None
    for line in text.splitlines():
        if m := re.match(r"\s*port\s+(\d+):", line):
            port = int(m[1])
        elif port is not None and (m := re.match(r"\s*tx pkts=(\d+|\?)", line)):
            out[port] = None if m[1] == "?" else int(m[1])
    return out


def _before(samples: list, t: float):
    return [s for s in samples if s[0] < t][-1][1]


def _after(samples: list, t: float):
    return next(s[1] for s in samples if s[0] > t)


def assert_spine2_uplink_idle_after(sampler: Sampler, t0: float, too_soon: str) -> None:
    """leaf1's samples from a sample after t0 on: its uplink to spine2 (port 4) sent nothing,
    the other three (3, 5, 6) carried the traffic."""
    samples = [(t, p) for t, p in sampler.ports if t > t0 + SAMPLE_S and p.get(3) is not None]
    assert len(samples) >= 2, too_soon
    first, last = samples[0][1], samples[-1][1]
    assert last.get(4) == first.get(4)  # no figure at all while it is down: nothing sent either
    assert sum(last[p] - first[p] for p in (3, 5, 6)) > 100


def run_sampled(tmp_path_factory, name: str, bridge: str, *sets: str) -> tuple[Path, subprocess.CompletedProcess, Sampler]:
    out = tmp_path_factory.mktemp("results")
    args = [a for s in sets for a in ("--set", s)]
    with Sampler(bridge) as sampler:
        r = fabric_emu("run", str(REPO / "experiments" / f"{name}.yaml"), "--out", str(out), *args)
    return only_run_dir(out, name), r, sampler


# --------------------------------------------------------------------------- a restart alone
@pytest.fixture(scope="module")
def restarted(tmp_path_factory):
    """The quickstart's ring all-reduce (8 hosts, 2 spines, 4 leaves), controller restarted at 500 us."""
    return run_sampled(tmp_path_factory, "controller-restart", "leaf1")


def test_ring_completes_trusted_with_no_loss_across_the_restart(restarted):
    run_dir, r, _ = restarted
    assert r.returncode == 0, r.stdout + r.stderr
    s = read_json(run_dir / "summary.json")
    assert s["status"] == "ok" and s["iterations_completed"] == 2
    assert s["fidelity"]["trusted"], s["fidelity"]
    assert s["switch"]["drops"] == 0 and s["transport"]["lost_packets"] == 0
    [event] = s["events"]
    assert event["kind"] == "controller" and event["ok"] and event["resynced"]
    [outage] = s["controller_outages"]
    assert outage["cause"] == "event" and outage["resynced"] and outage["switches"] == 6
    assert outage["cold_starts"] == 0
    # the outage lasted from the kill to the last switch's barrier: the new process's start-up
    # and Open vSwitch's reconnection backoff (1 s at most, fabric_emu.fabric.build)
    assert 0.2 < outage["outage_s"] < 10 and outage["outage_fabric_us"] == pytest.approx(
        outage["outage_s"] / s["dilation"] * 1e6, rel=1e-3)
    assert outage["down_fabric_us"] == pytest.approx(500, abs=50)
    assert "controller outage" in r.stdout


def test_the_warm_start_sent_nothing(restarted):
    """Nothing changed while the controller was away: every switch already held what the new
    controller wanted (its own count, and its log)."""
    run_dir, _, _ = restarted
    [outage] = read_json(run_dir / "summary.json")["controller_outages"]
    assert outage["warm_start"]["messages"] == 0, outage
    assert outage["warm_start"]["flows_kept"] > 100  # the 6 switches' tables were read and compared
    log = (run_dir / "logs" / "controller.log").read_text()
    assert log.count("warm start, sent 0 messages") == 6  # after the restart; at bring-up they were empty
    assert "cold start" not in log and "Traceback" not in log


def test_switch_kept_forwarding_and_kept_its_flows(restarted):
    """Measured on leaf1 itself: during the outage its flows counted packets (fail-secure), and
    after the warm start each flow is the same one (its age went on, its count never went back):
    a deletion, or the cold start's reset, would have made them new."""
    run_dir, _, sampler = restarted
    s = read_json(run_dir / "summary.json")
    [event] = s["events"]
    down = event["fired_wall"]
    back = down + s["controller_outages"][0]["outage_s"]
    before, after = _before(sampler.flows, down), _after(sampler.flows, back)
    during = [f for t, f in sampler.flows if down < t < back]
    assert during, "no sample while the controller was away"
    assert set(before) == set(after) and len(before) >= 20
    for flow, (age, packets) in before.items():
        assert after[flow][0] > age + (back - down) * 0.9, flow  # the same flow, older
        assert after[flow][1] >= packets, flow
    # the routes forwarded while no controller was there: table 1's packet counts grew
    routed = lambda f: sum(n for k, (_, n) in f.items() if k.startswith("table=1"))  # noqa: E731
    assert routed(during[-1]) > routed(before), (routed(before), routed(during[-1]))


# --------------------------------------------------------------------------- then a link fails
@pytest.fixture(scope="module")
def rerouted(tmp_path_factory):
    """link-failure.yaml's ring (4 hosts, 4 spines, 4 QPs per peer): the controller restarted at
    200 us, then leaf1-spine2 cut at 1000 us, which only the new controller can route around."""
    return run_sampled(tmp_path_factory, "link-failure", "leaf1",
                       "events=[{at: 200us, controller: restart}, {at: 1000us, link: leaf1-spine2, state: down}]")


def test_a_link_cut_after_the_restart_is_rerouted(rerouted):
    run_dir, r, sampler = rerouted
    assert r.returncode == 0, r.stdout + r.stderr
    s = read_json(run_dir / "summary.json")
    assert s["status"] == "ok"
    restart, cut = s["events"]
    assert restart["ok"] and restart["resynced"] and cut["ok"]
    assert cut["fired_wall"] > restart["fired_wall"] + restart["outage_s"]  # after the resync
    [moved] = s["failover"]
    assert moved["link"] == "leaf1-spine2" and moved["rerouted"] and moved["mode"] == "global"
    # Open vSwitch's counters on leaf1: its uplink to spine2 (port 4) stops, the others carry on.
    rerouted_at = cut["fired_wall"] + moved["failover_s"]
    assert_spine2_uplink_idle_after(sampler, rerouted_at, "the run ended too soon after the cut to see the traffic move")


# --------------------------------------------------------------------------- a crash nobody planned
def running_controller() -> int:
    """The pid of the running run's controller, from that run's own record: the run lock allows
    one run at a time, so one record has a live owner. (Not by pattern among all processes: a
    controller some other, dead, run left would be taken for it.)"""
    [pid] = [p.pid for rec in live_records() for p in rec.processes if p.role == "controller" and p.alive()]
    return pid


class Crasher(Sampler):
    """Also SIGKILLs the run's controller once leaf1's routes have carried RoCE traffic."""

    def __init__(self, bridge: str, after_packets: int = 2000):
        super().__init__(bridge)
        self.after_packets, self.killed_at, self.killed_pid = after_packets, None, None

    def ticks(self) -> Iterator[None]:
        while True:
            yield
            flows = subprocess.run([*OFCTL, "dump-flows", self.bridge], capture_output=True, text=True).stdout
            routed = sum(n for k, (_, n) in parse_flows(flows).items() if k.startswith("table=1"))
            if self.killed_at is None and routed > self.after_packets:
                pid = running_controller()
                os.kill(pid, signal.SIGKILL)
                self.killed_at, self.killed_pid = time.time(), pid


@pytest.fixture(scope="module")
def crashed(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    with Crasher("leaf1") as crasher:
        r = fabric_emu("run", str(REPO / "experiments" / "link-failure.yaml"), "--out", str(out),
                       "--set", "events=[]")
    return only_run_dir(out, "link-failure"), r, crasher


def test_a_controller_that_dies_on_its_own_is_restarted(crashed):
    run_dir, r, crasher = crashed
    assert crasher.killed_at is not None, "the traffic never started"
    assert r.returncode == 0, r.stdout + r.stderr
    assert "the controller died on its own" in r.stdout
    s = read_json(run_dir / "summary.json")
    assert s["status"] == "ok"
    [outage] = s["controller_outages"]
    assert outage["cause"] == "crashed" and outage["resynced"] and outage["cold_starts"] == 0
    assert outage["warm_start"]["messages"] == 0
    assert 0.2 < outage["outage_s"] < 10
    assert s["switch"]["drops"] == 0
    log = (run_dir / "logs" / "controller.log").read_text()
    assert log.count("listening on") == 2 and "cold start" not in log


# --------------------------------------------------------------------------- a link fails while it is away
@pytest.fixture(scope="module")
def cut_while_away(tmp_path_factory):
    """The controller stopped at 200 us, leaf1-spine2 cut at 300 us with no controller to hear
    it, the controller started again at 500 us: it must learn the cut from the switches' ports.
    Lossy (PFC off): the frames leaf1 sends into the dead port until the controller is back are
    lost, and RC resends them. The lossless case is cut_while_away_lossless, below."""
    return run_sampled(tmp_path_factory, "link-failure", "leaf1", "pfc.enabled=false", *AWAY_EVENTS)


AWAY_EVENTS = ("events=[{at: 200us, controller: stop}, {at: 300us, link: leaf1-spine2, state: down}, "
               "{at: 500us, controller: start}]",)


def test_a_link_cut_while_the_controller_was_away_is_routed_around_when_it_returns(cut_while_away):
    run_dir, r, sampler = cut_while_away
    assert r.returncode == 0, r.stdout + r.stderr
    s = read_json(run_dir / "summary.json")
    assert s["status"] == "ok"
    stop, cut, start = s["events"]
    assert stop["ok"] and cut["ok"] and start["ok"] and start["resynced"]
    [outage] = s["controller_outages"]
    assert outage["resynced"] and outage["cold_starts"] == 0
    # the tables changed for the cut: new routes and groups, sent as a difference, not a wipe
    w = outage["warm_start"]
    assert w["flows_modified"] + w["groups_added"] > 0 and w["flows_kept"] > 50, w
    log = (run_dir / "logs" / "controller.log").read_text()
    assert "link leaf1-spine2 is down at dpid" in log
    # measured on leaf1: once the new controller was back, its uplink to spine2 stays idle and
    # the other three carry the traffic
    back = stop["fired_wall"] + start["outage_s"]  # the outage runs from the stop to the resync
    assert_spine2_uplink_idle_after(sampler, back, "the run ended too soon after the controller came back")


@pytest.fixture(scope="module")
def cut_while_away_lossless(tmp_path_factory):
    """The same, with PFC on (the experiment's default). The frames leaf1 keeps sending into the
    dead link were charged to the ports they came in by; before the link had a wire
    (fabric_emu/fabric/wires.py) the kernel refused them before any port program saw them, their
    charge stayed, and those ports paused their hosts for ever: the run stalled to its deadline."""
    return run_sampled(tmp_path_factory, "link-failure", "leaf1", *AWAY_EVENTS)


def test_a_lossless_link_cut_while_the_controller_was_away_gives_its_buffer_back(cut_while_away_lossless):
    run_dir, r, sampler = cut_while_away_lossless
    assert r.returncode == 0, r.stdout + r.stderr
    s = read_json(run_dir / "summary.json")
    assert s["status"] == "ok" and s["fidelity"]["trusted"], s["fidelity"]
    stop, cut, start = s["events"]
    assert cut["ok"] and start["resynced"]
    # leaf1 sent into the cut link until the controller was back: its port program dropped those
    # frames (counted) and gave their bytes back, so nothing stayed charged at the end
    rows = list(csv.DictReader((run_dir / "ports.csv").open()))
    dead = {r["intf"]: int(r["cut_drops"]) for r in rows if {r["switch"], r["peer"]} == {"leaf1", "spine2"}}
    assert len(dead) == 2 and dead[next(i for i in dead if i.startswith("leaf1"))] > 0, dead
    assert all(int(r["cut_drops"]) == 0 for r in rows if r["intf"] not in dead)
    accounting = s["pfc_accounting"]
    assert accounting["settled"] and accounting["leaked_bytes"] == 0, accounting
    assert accounting["over_credited_bytes"] == 0 and not accounting["negative_pairs"], accounting
    assert s["transport"]["lost_packets"] > 0  # the frames on the cut link, resent by RC
    back = stop["fired_wall"] + start["outage_s"]
    assert_spine2_uplink_idle_after(sampler, back, "the run ended too soon after the controller came back")
