"""The PFC watchdog and NIC storms in the live views, from fake snapshots and a real-layout ports
table: the reader's fields from map words, top's STORMED and footer, the exporter's families,
and the storm counts a run's final view keeps."""

from __future__ import annotations

import json
import re
from array import array
from pathlib import Path
from types import SimpleNamespace

from rich.console import Console

from fabric_emu.live.exporter import metric_families
from fabric_emu.live.manifest import LiveManifest, LivePort
from fabric_emu.live.publish import RunPublisher
from fabric_emu.live.reader import LiveReader, final_storms, storm_fields
from fabric_emu.live.snapshot import PortSample, Snapshot, storm_summary
from fabric_emu.live.top import json_view, render, storm_line
from fabric_emu.ports.layout import PORT_BYTES, PortTable
from fabric_emu.ports.watchdog import STATUS_FIELDS, clear_status
from tests.unit.test_live import snap

LAB = (("peer", "h4"), ("port", "1"), ("switch", "leaf2"))


def table(n_ports: int = 4) -> PortTable:
    return PortTable(memoryview(array("Q", [0] * (n_ports * PORT_BYTES // 8))))


def stormy(stormed: bool = True, detected: int = 1, restored: int = 0, peer_storming: bool = True) -> Snapshot:
    """snap() plus leaf2-eth1 towards h4: its queue stormed and h4's NIC storming."""
    s = snap(101.0, 6_250_000)
    s.ports.append(PortSample("leaf2", 1, "leaf2-eth1", "h4", "host", 100.0, dict(s.ports[0].counters),
                              {3: 0}, {3: True}, stormed=stormed, storms_detected=detected,
                              storms_restored=restored, peer_storming=peer_storming))
    return s


def _text(s: Snapshot, width: int = 300) -> str:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))
    console.print(render(None, s))
    return console.export_text()


# ------------------------------------------------------------------ reader
def test_the_reader_turns_map_words_into_storm_fields():
    t = table()
    t.set(2, "wd_status", 1)
    t.set(2, "wd_detected", 3)
    t.set(2, "wd_restored", 2)
    t.set(2, "peer_stalled", 1)
    assert storm_fields(t, 2) == {"stormed": True, "storms_detected": 3, "storms_restored": 2, "peer_storming": True}
    assert storm_fields(t, 1) == {"stormed": False, "storms_detected": 0, "storms_restored": 0, "peer_storming": False}
    ports = [LivePort(2, "leaf2", 1, "leaf2-eth1", "h4", "host", 100.0)]
    assert final_storms(t, ports) == {"leaf2-eth1": {"storms_detected": 3, "storms_restored": 2}}


def test_a_new_daemon_zeroes_the_last_ones_watchdog_words():
    t = table()
    for name in STATUS_FIELDS:
        t.set(1, name, 5)
    t.set(1, "peer_stalled", 1)  # the runner's, not the daemon's
    clear_status(t, [0, 1])
    assert [t.get(1, name) for name in STATUS_FIELDS] == [0, 0, 0] and t.get(1, "peer_stalled") == 1


def _manifest(tmp_path: Path) -> LiveManifest:
    return LiveManifest("r1", "pfc-storm", 2000.0, "ecmp", "dcqcn", str(tmp_path), "/nonexistent", "",
                        [LivePort(1, "leaf2", 1, "leaf2-eth1", "h4", "host", 100.0)], path=str(tmp_path / "live.json"))


def test_the_final_view_keeps_the_runs_storm_counts(tmp_path):
    t = table()
    t.set(1, "wd_status", 1)
    t.set(1, "wd_detected", 2)
    t.set(1, "wd_restored", 1)
    pub = RunPublisher(SimpleNamespace(save=lambda: None), _manifest(tmp_path), None)
    pub.start()
    pub.traffic_started([])
    pub.traffic_ended([{"switch": "leaf2", "port": 1, "intf": "leaf2-eth1", "peer": "h4", "kind": "host",
                        "tx_bytes": 9}], t)
    reader = LiveReader(pub.manifest.path)
    try:
        (p,) = reader.snapshot().ports
    finally:
        reader.close()
    assert (p.storms_detected, p.storms_restored, p.stormed, p.peer_storming) == (2, 1, False, False)
    pub.traffic_started([])  # a lab's next run: the last run's counts are gone
    assert LiveManifest.load(pub.manifest.path).final_storms is None


# ------------------------------------------------------------------ top
def test_top_marks_a_stormed_queue_and_a_storming_nic():
    text = _text(stormy())
    row = next(line for line in text.splitlines() if "leaf2" in line and " 1 " in line)
    assert "PAUSED STORMED" in row and "h4 storming" in row
    assert "PFC watchdog: 1 queue stormed now (leaf2-eth1), 1 storm detected / 0 restored; NIC storming: h4" in text


def test_top_says_nothing_of_the_watchdog_until_something_stormed():
    assert "PFC watchdog" not in _text(snap(101.0, 0)) and "STORMED" not in _text(snap(101.0, 0))
    after = stormy(stormed=False, detected=2, restored=2, peer_storming=False)
    assert storm_line(storm_summary(after)) == "PFC watchdog: 0 queues stormed now, 2 storms detected / 2 restored"
    assert storm_line(storm_summary(stormy(stormed=False, detected=0))) == "NIC storming: h4"


def test_a_stormed_port_is_shown_when_not_every_port_fits():
    s = stormy()
    s.ports.insert(0, PortSample("leaf1", 9, "leaf1-eth9", "spine2", "fabric", 100.0, {}, {}, {}))
    prev = snap(100.0, 0)
    console = Console(width=300, record=True, file=open("/dev/null", "w"))
    console.print(render(prev, s, max_ports=1))
    assert "STORMED" in console.export_text()


def test_json_view_has_the_storm_fields_and_their_sum():
    view = json.loads(json.dumps(json_view(None, stormy())))
    p = view["ports"][1]
    assert (p["stormed"], p["storms_detected"], p["storms_restored"], p["peer_storming"]) == (True, 1, 0, True)
    assert view["storms"] == {"stormed": ["leaf2-eth1"], "detected": 1, "restored": 0, "nics_storming": ["h4"]}
    assert Snapshot.from_dict(stormy().to_dict()) == stormy()


# ------------------------------------------------------------------ exporter
def _samples(s: Snapshot) -> dict[tuple[str, tuple], float]:
    return {(smp.name, tuple(sorted(smp.labels.items()))): smp.value for fam in metric_families(s) for smp in fam.samples}


def test_the_exporter_serves_the_watchdog_and_storms():
    m = _samples(stormy(detected=3, restored=2))
    assert m[("fabric_emu_pfcwd_stormed", LAB)] == 1.0
    assert m[("fabric_emu_pfc_storm_peer", LAB)] == 1.0
    assert m[("fabric_emu_pfcwd_storms_detected_total", LAB)] == 3
    assert m[("fabric_emu_pfcwd_storms_restored_total", LAB)] == 2
    other = (("peer", "spine1"), ("port", "3"), ("switch", "leaf1"))
    assert m[("fabric_emu_pfcwd_stormed", other)] == 0.0 and m[("fabric_emu_pfcwd_storms_detected_total", other)] == 0


def test_storm_counters_only_once_they_count_from_traffic_start():
    s = stormy()
    s.baseline = False
    names = {n for n, _ in _samples(s)}
    assert {"fabric_emu_pfcwd_stormed", "fabric_emu_pfc_storm_peer"} <= names
    assert not any(n.startswith("fabric_emu_pfcwd_storms_") for n in names)


def test_docs_list_the_storm_metrics():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    served = {n for n, _ in _samples(stormy())}
    storm = {n for n in served if re.search(r"pfcwd|storm", n)}
    assert len(storm) == 4 and all(f"`{n}`" in doc for n in storm), storm
