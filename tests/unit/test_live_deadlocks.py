"""PFC deadlocks in the live views, from hand-made snapshots of the 4-switch ring
(experiments/deadlock-ring.yaml): the reader's waits from the pair map, the cycles, top's
DEADLOCK marks and footer, the exporter's gauges, and the lab's `deadlocks` command."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from fabric_emu.lab import commands as c
from fabric_emu.lab import views
from fabric_emu.live.exporter import metric_families
from fabric_emu.live.manifest import LivePort
from fabric_emu.live.reader import deadlocks_now, waits_of
from fabric_emu.live.snapshot import DeadlockCycle, PortSample, Snapshot, deadlock_cycles, deadlocked_ports
from fabric_emu.live.top import deadlock_line, json_view, render
from tests.unit.test_live import snap

RING = ["r1", "r2", "r3", "r4"]
CYCLE = "r1.in(r4) -> r2.in(r1) -> r3.in(r2) -> r4.in(r3)"


def ring_ports() -> list[LivePort]:
    """ring4's switch ports as the manifest has them: port 1 to the host, 2 clockwise, 3 back."""
    out = []
    for i, sw in enumerate(RING):
        cw, ccw = RING[(i + 1) % 4], RING[(i - 1) % 4]
        for port, peer, kind in ((1, f"h{i + 1}", "host"), (2, cw, "fabric"), (3, ccw, "fabric")):
            out.append(LivePort(3 * i + port, sw, port, f"{sw}-eth{port}", peer, kind, 100.0))
    return out


def _id(ports: list[LivePort], sw: str, peer: str) -> int:
    return next(p.id for p in ports if p.switch == sw and p.peer == peer)


def locked_pairs(ports: list[LivePort]) -> dict[tuple[int, int], int]:
    """Each switch holds bytes from its counter-clockwise neighbour for its clockwise one (the
    flows pinned two hops clockwise), and a little from its host."""
    out = {}
    for i, sw in enumerate(RING):
        cw, ccw = RING[(i + 1) % 4], RING[(i - 1) % 4]
        out[(_id(ports, sw, ccw), _id(ports, sw, cw))] = 100_000 + i
        out[(_id(ports, sw, f"h{i + 1}"), _id(ports, sw, cw))] = 4_000
    return out


def locked_pause() -> dict[str, dict[int, bool]]:
    """Every clockwise egress paused (port 2), nothing else."""
    return {p.intf: {3: p.port == 2} for p in ring_ports()}


class FakeMaps:
    def __init__(self, pairs):
        self._pairs, self.walked = pairs, 0

    def pairs(self):
        self.walked += 1
        return self._pairs


def locked_snapshot() -> Snapshot:
    s = snap(101.0, 6_250_000)
    s.experiment = "deadlock-ring"
    s.ports = [PortSample(lp.switch, lp.port, lp.intf, lp.peer, lp.kind, lp.gbps, {}, {3: 50_000},
                          locked_pause()[lp.intf]) for lp in ring_ports()]
    s.deadlocks = [DeadlockCycle(CYCLE.split(" -> "), [100_000, 100_001, 100_002, 100_003])]
    return s


def _text(s: Snapshot, prev: Snapshot | None = None, max_ports: int | None = None) -> str:
    console = Console(width=300, record=True, file=open("/dev/null", "w"))
    console.print(render(prev, s, max_ports=max_ports))
    return console.export_text()


# ------------------------------------------------------------------ reader
def test_the_reader_names_the_pair_map_as_the_detector_does():
    ports = ring_ports()
    held, paused = waits_of(locked_pairs(ports), ports, locked_pause())
    assert held[("r2", "r1", "r3")] == 100_001 and held[("r2", "h2", "r3")] == 4_000
    assert paused == {("r1", "r2"), ("r2", "r3"), ("r3", "r4"), ("r4", "r1")}
    assert waits_of({(999, 1): 5}, ports, {}) == ({}, set())  # an id not in the manifest


def test_the_ring_locked_is_one_cycle_of_four_buffers():
    ports = ring_ports()
    (cyc,) = deadlocks_now(FakeMaps(locked_pairs(ports)), ports, locked_pause())
    assert cyc.text == CYCLE and cyc.edge_bytes == [100_000, 100_001, 100_002, 100_003]
    assert cyc.held_bytes == 400_006
    assert cyc.egresses() == [("r1", "r2"), ("r2", "r3"), ("r3", "r4"), ("r4", "r1")]


def test_the_pair_map_is_walked_only_when_a_lossless_egress_is_paused():
    ports = ring_ports()
    maps = FakeMaps(locked_pairs(ports))
    calm = {p.intf: {0: True, 3: False} for p in ports}  # a paused best-effort class does not count
    assert deadlocks_now(maps, ports, calm) == [] and maps.walked == 0
    one_paused = {**calm, "r1-eth2": {3: True}}
    assert deadlocks_now(maps, ports, one_paused) == [] and maps.walked == 1  # a wait, no cycle


def test_no_cycle_when_one_ring_egress_drains():
    ports = ring_ports()
    held, paused = waits_of(locked_pairs(ports), ports, locked_pause())
    assert deadlock_cycles(held, paused - {("r3", "r4")}, RING) == []
    assert deadlock_cycles(held, set(), RING) == []


# ------------------------------------------------------------------ snapshot, top
def test_ports_on_the_cycle_are_its_paused_egresses():
    assert deadlocked_ports(locked_snapshot()) == {"r1-eth2", "r2-eth2", "r3-eth2", "r4-eth2"}
    assert deadlocked_ports(snap(101.0, 0)) == set()


def test_top_shows_the_cycle_and_marks_its_ports():
    text = _text(locked_snapshot())
    assert f"DEADLOCK  {CYCLE}  (4 buffers, 400.0 KB held)" in text
    rows = [ln for ln in text.splitlines() if ln.startswith("│ r")]
    assert sum("PAUSED DEADLOCK" in r for r in rows) == 4
    assert all("DEADLOCK" not in r for r in rows if " 1 " in r[:20] or " 3 " in r[:20])
    assert deadlock_line(locked_snapshot().deadlocks[0]).startswith("DEADLOCK  r1.in(r4) -> ")


def test_top_says_nothing_of_deadlocks_without_one():
    assert "DEADLOCK" not in _text(snap(101.0, 0))


def test_a_deadlocked_port_is_shown_when_not_every_port_fits():
    s = locked_snapshot()
    prev = locked_snapshot()
    prev.taken = 100.0
    assert "PAUSED DEADLOCK" in _text(s, prev, max_ports=1)


def test_the_snapshot_keeps_its_cycles_through_json():
    s = locked_snapshot()
    assert Snapshot.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    view = json.loads(json.dumps(json_view(None, s)))
    assert view["deadlocks"] == [{"members": CYCLE.split(" -> "), "edge_bytes": [100_000, 100_001, 100_002, 100_003]}]
    assert view["deadlocked_ports"] == ["r1-eth2", "r2-eth2", "r3-eth2", "r4-eth2"]
    old = s.to_dict()
    old.pop("deadlocks")  # a snapshot written before deadlocks were read
    assert Snapshot.from_dict(old).deadlocks == []


# ------------------------------------------------------------------ exporter
def _samples(s: Snapshot) -> dict[tuple[str, tuple], float]:
    return {(smp.name, tuple(sorted(smp.labels.items()))): smp.value for fam in metric_families(s) for smp in fam.samples}


def test_the_exporter_serves_the_cycles_and_their_ports():
    m = _samples(locked_snapshot())
    assert m[("fabric_emu_deadlock_cycles", ())] == 1
    assert m[("fabric_emu_deadlock_port", (("peer", "r3"), ("port", "2"), ("switch", "r2")))] == 1.0
    assert m[("fabric_emu_deadlock_port", (("peer", "r1"), ("port", "3"), ("switch", "r2")))] == 0.0
    calm = _samples(snap(101.0, 0))
    assert calm[("fabric_emu_deadlock_cycles", ())] == 0


def test_docs_list_the_deadlock_metrics():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    served = {n for n, _ in _samples(locked_snapshot()) if re.search(r"deadlock", n)}
    assert served == {"fabric_emu_deadlock_cycles", "fabric_emu_deadlock_port"}
    assert all(f"`{n}`" in doc for n in served)


# ------------------------------------------------------------------ the lab's `deadlocks`
def test_deadlocks_lines_parse():
    assert c.parse_deadlocks([]) == ("now", "last")
    assert c.parse_deadlocks(["now"]) == ("now",) and c.parse_deadlocks(["last"]) == ("last",)
    for words in (["later"], ["now", "last"]):
        with pytest.raises(c.LabInputError, match="deadlocks: expected nothing, now .* or last"):
            c.parse_deadlocks(words)


def test_paths_cannot_change_with_the_fabric_up():
    with pytest.raises(c.LabInputError, match="paths: the fabric is routed with them"):
        c.parse_set(["paths=[]"])


def _printed(fn, *args) -> str:
    con = Console(record=True, width=300, file=open("/dev/null", "w"))
    fn(con, *args)
    return con.export_text()


def test_deadlocks_now_prints_the_members_and_what_each_holds():
    text = _printed(views.print_deadlocks_now, locked_snapshot().deadlocks, [])
    assert "DEADLOCK now: 1 cycle" in text and f"{CYCLE}  (4 buffers, 400.0 KB held)" in text
    assert "r1.in(r4) holds 100.0 KB for r1->r2, paused by r2: waits on r2.in(r1)" in text
    assert "r4.in(r3) holds 100.0 KB for r4->r1, paused by r1: waits on r1.in(r4)" in text
    assert _printed(views.print_deadlocks_now, [], []).strip() == "no deadlock now (no lossless egress paused)"
    assert "1 lossless egress paused: r1-eth2" in _printed(views.print_deadlocks_now, [], ["r1-eth2"])


SUMMARY = {"min_duration_s": 0.0004, "cycles_seen": 1, "formations": 3, "persistent_formations": 3,
           "first_formed_s": 5.6228e-05, "first_persistent_s": 5.6228e-05, "period_s": 0.0021,
           "deadlocked_at_end": False,
           "persistent": [{"cycle": CYCLE, "length": 4, "formations": 3, "persistent_formations": 3,
                           "first_formed_s": 5.6228e-05, "longest_s": 0.0012, "max_bytes": 403186,
                           "period_s": 0.0021, "unbroken_at_end": False}]}


def test_deadlocks_last_sums_up_the_last_run():
    text = _printed(views.print_deadlocks_last, "wd", {"deadlocks": SUMMARY})
    assert ("wd: 3 formations of 1 cycle, 3 persistent (held >= 400.0 us); first formed at 56.2 us, "
            "period 2,100.0 us; deadlocked at the end: no") in text
    assert (f"{CYCLE}  (4 buffers): 3 formations, first at 56.2 us, longest 1,200.0 us, most held 403.2 KB, "
            "period 2,100.0 us, broken") in text
    ring = {**SUMMARY, "formations": 1, "period_s": None, "deadlocked_at_end": True,
            "persistent": [{**SUMMARY["persistent"][0], "formations": 1, "period_s": None, "unbroken_at_end": True}]}
    text = _printed(views.print_deadlocks_last, "ring", {"deadlocks": ring})
    assert "period -; deadlocked at the end: yes" in text and "unbroken at the end" in text
    assert "no deadlock formed" in _printed(views.print_deadlocks_last, "ccw", {"deadlocks": {
        **SUMMARY, "formations": 0, "cycles_seen": 0, "persistent": []}})
    assert "no run yet" in _printed(views.print_deadlocks_last, None, None)


def test_failover_cannot_change_with_the_fabric_up():
    with pytest.raises(c.LabInputError, match="failover: the fabric is routed with it"):
        c.parse_set(["failover=local"])
