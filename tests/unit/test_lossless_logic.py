"""Pure parts of the lossless ports: RED profile, PFC timing and state machines, headroom,
the BPF struct layout, and the ECN/PFC spec checks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fabric_emu.cc.headroom import headroom_bytes, response_quanta
from fabric_emu.cc.pfc import PauseReceiver, PauseSender, pause_seconds, pfc_frame
from fabric_emu.cc.red import PMAX_SCALE, mark_probability, pmax_scaled
from fabric_emu.spec.errors import SpecError
from fabric_emu.spec.load import load_experiment
from fabric_emu.ports import layout

C_SOURCE = Path(__file__).resolve().parents[2] / "fabric_emu" / "ports" / "bpf" / "port.c"


# ------------------------------------------------------------------ RED
@pytest.mark.parametrize("depth, expected", [
    (0, 0.0), (100_000, 0.0), (100_001, 0.2 / 300_000), (250_000, 0.1), (400_000, 0.2), (400_001, 1.0)])
def test_mark_probability_follows_the_profile(depth: int, expected: float) -> None:
    assert mark_probability(depth, 100_000, 400_000, 0.2) == pytest.approx(expected)


def test_pmax_scaled_saturates_at_certainty() -> None:
    assert pmax_scaled(1.0) == PMAX_SCALE
    assert pmax_scaled(0.5) == PMAX_SCALE // 2


# ------------------------------------------------------------------ PFC timing
def test_pause_quanta_are_512_bit_times_at_the_modelled_rate_times_the_dilation() -> None:
    # 100 Gb/s: 5.12 ns a quantum, 65535 quanta = 335.5 us (protocol_facts §4.1)
    assert pause_seconds(65535, 100) == pytest.approx(335.5392e-6)
    assert pause_seconds(65535, 100, dilation=2000) == pytest.approx(0.6710784)
    assert pause_seconds(1, 25) == pytest.approx(20.48e-9)


def test_sender_pauses_refreshes_while_asserted_and_resumes_once() -> None:
    s = PauseSender(quanta=0xFFFF, refresh_s=0.3)
    assert s.on_timer(0.0) == []
    assert s.on_xoff(1.0) == [0xFFFF]
    assert s.on_timer(1.2) == []  # not yet half a pause
    assert s.on_timer(1.31) == [0xFFFF]  # refreshed before the upstream's pause runs out
    assert s.on_timer(1.5) == []
    assert s.on_xon(1.55) == [0]
    assert s.on_xon(1.56) == []  # nothing to resume
    assert s.on_timer(5.0) == []  # no refresh after the resume


def test_sender_catches_up_with_the_port_state_when_an_event_was_lost() -> None:
    s = PauseSender(quanta=0xFFFF, refresh_s=0.3)
    assert s.on_level(False, 0.0) == []  # in line: nothing to send
    assert s.on_level(True, 0.1) == [0xFFFF] and s.asserted  # the XOFF event was lost
    assert s.on_level(True, 0.2) == []
    assert s.on_timer(0.4) == [0xFFFF]  # refreshed like any pause
    assert s.on_level(False, 0.5) == [0] and not s.asserted  # the XON was lost: resume, once
    assert s.on_timer(5.0) == [] and s.on_level(False, 5.0) == []


def test_receiver_pauses_extends_expires_and_resumes_on_zero() -> None:
    r = PauseReceiver()
    assert r.on_frame(0.0, 0.5) == "close"
    assert r.on_frame(0.4, 0.5) is None  # a refresh extends the pause
    assert r.on_timer(0.6) is None  # would have expired without the refresh
    assert r.on_timer(0.9) == "open"
    assert r.on_frame(1.0, 0.5) == "close"
    assert r.on_frame(1.1, 0.0) == "open"  # quanta 0: resume at once
    assert r.on_frame(1.2, 0.0) is None


def test_pfc_frame_bytes_match_the_scapy_definition() -> None:
    from scapy.contrib.mac_control import MACControlClassBasedFlowControl
    from scapy.layers.l2 import Ether

    raw = pfc_frame(bytes.fromhex("0efeffff0007"), 0xFFFF, priority=3)
    assert len(raw) == 60
    pkt = Ether(raw)
    assert pkt.dst == "01:80:c2:00:00:01" and pkt.type == 0x8808
    pfc = pkt[MACControlClassBasedFlowControl]
    assert pfc.c3_enabled == 1 and pfc.c3_pause_time == 0xFFFF
    assert pfc.c0_enabled == 0 and pfc.c0_pause_time == 0


# ------------------------------------------------------------------ headroom
def test_headroom_formula_matches_sonic_tables_within_their_rounding() -> None:
    assert response_quanta(100) == 394 and response_quanta(25) == 80 and response_quanta(1600) == 905
    # SONiC Mellanox SN4280, 100G: 5 m -> 300 m adds 37,888 B; the formula's cable term 37,247 B
    delta = headroom_bytes(4214, 100, 300) - headroom_bytes(4214, 100, 5)
    assert abs(delta - 37_888) < 2048
    assert headroom_bytes(4214, 100, 100) % 1024 == 0


# ------------------------------------------------------------------ BPF layout
def test_python_layout_mirrors_struct_port() -> None:
    body = re.search(r"struct port \{(.*?)\n\};", C_SOURCE.read_text(), re.S).group(1)
    fields = []
    for decl in re.findall(r"__u64 ([^;]+);", body):
        for name in decl.split(","):
            m = re.fullmatch(r"\s*(\w+)(?:\[(\w+)\])?\s*", name)
            n = m.group(2)
            fields.append((m.group(1), 1 if n is None else (layout.NPRIO if n == "NPRIO" else int(n))))
    assert tuple(fields) == layout.FIELDS


def test_event_struct_matches() -> None:
    body = re.search(r"struct event \{(.*?)\n\};", C_SOURCE.read_text(), re.S).group(1)
    sizes = [8 if t == "__u64" else 4 for t in re.findall(r"(__u64|__u32) \w+;", body)]
    assert sum(sizes) == layout.EVENT.size


# ------------------------------------------------------------------ spec
def _load(spec_dir: Path, *sets: str):
    return load_experiment(spec_dir / "exp.yaml", list(sets))


def test_defaults_are_on_and_headroom_is_computed(spec_dir: Path) -> None:
    spec = _load(spec_dir)
    assert spec.ecn.enabled and spec.pfc.enabled
    assert spec.pfc.headroom == headroom_bytes(4214, 100, 100)


@pytest.mark.parametrize("sets, field, words", [
    (["ecn.kmin=500KB"], "ecn.kmin", "not below kmax"),
    (["pfc.xon=200KB"], "pfc.xon", "not below xoff"),
    (["ecn.kmax=2MB"], "ecn.kmax", "beyond topology.port_buffer"),
    (["pfc.xoff=990KB"], "pfc.xoff", "beyond topology.port_buffer"),
    (["pfc.headroom=8KB"], "pfc.headroom", "cannot keep 100 Gb/s lossless"),
    (["pfc.quanta=0"], "pfc.quanta", "greater than or equal to 1"),
    (["ecn.pmax=1.5"], "ecn.pmax", "less than or equal to 1"),
])
def test_impossible_thresholds_are_input_errors(spec_dir: Path, sets, field, words) -> None:
    with pytest.raises(SpecError) as e:
        _load(spec_dir, *sets)
    (problem,) = e.value.problems
    assert problem[1] == field and words in problem[2]


def test_thresholds_checks_skip_what_is_off(spec_dir: Path) -> None:
    spec = _load(spec_dir, "pfc.enabled=false", "pfc.headroom=8KB", "ecn.enabled=false", "ecn.kmax=2MB")
    assert not spec.pfc.enabled and not spec.ecn.enabled


# ------------------------------------------------------------------ report
def _plan():
    from fabric_emu.spec.topology import TopologySpec
    from fabric_emu.topo.plan import build_plan

    return build_plan(TopologySpec(name="t", kind="leaf-spine", spines=1, leaves=2, hosts_per_leaf=1,
                                   dilation=1000))


def test_pause_rows_are_relative_to_the_start_in_both_worlds() -> None:
    from fabric_emu.results.switch import pause_rows

    rows = pause_rows(_plan(), {"intervals": {"spine1-eth1": [[10.5, 10.6]], "h2-eth0": [[11.0, None]],
                                              "gone-eth9": [[1, 2]]}}, t0=10.0)
    assert [r["intf"] for r in rows] == ["h2-eth0", "spine1-eth1"]  # unknown ports are ignored
    h2, spine = rows
    assert (spine["node"], spine["peer"], spine["start_s"], spine["end_s"]) == ("spine1", "leaf1", 0.5, 0.6)
    assert spine["start_fabric_us"] == 500.0 and spine["end_fabric_us"] == pytest.approx(600.0)
    assert h2["end_s"] == "" and h2["peer"] == "leaf2"  # still paused when the daemon stopped


def test_reaction_summary_in_both_worlds() -> None:
    from fabric_emu.results.switch import reaction_summary

    assert reaction_summary({}, 2000) is None
    r = reaction_summary({"reaction_s": [0.004, 0.001, 0.002]}, 2000)
    assert r == {"pauses_measured": 3, "p50_s": 0.002, "max_s": 0.004, "p50_fabric_us": 1.0, "max_fabric_us": 2.0}
    late = {"wakes": 10, "over_1ms": 1, "max_ms": 2.5}
    assert reaction_summary({"reaction_s": [0.001], "late_wake": late}, 2000)["late_wake"] == late


def test_late_wakes_count_what_the_machine_held_back() -> None:
    from fabric_emu.ports.pfcd import LateWakes

    w = LateWakes()
    for late_s in (0.00002, -0.0001, 0.0009, 0.0011, 0.0062):  # early wakes (a capped timeout) count as on time
        w.woke(late_s)
    assert w.report() == {"wakes": 5, "over_1ms": 2, "max_ms": 6.2}


def _row(**kw):
    from fabric_emu.measure.counters import PortCounters

    return PortCounters("leaf1", 1, "leaf1-eth1", "h1", "host", **kw)


ECN = {"enabled": True, "kmin": 100_000, "kmax": 400_000}


def test_lossless_warnings_name_each_broken_promise() -> None:
    from fabric_emu.ports.model import PfcSettings
    from fabric_emu.results.switch import lossless_warnings

    pfc = PfcSettings(True, 100_000, 80_000, 47_104, 0xFFFF)
    fine = [_row(max_backlog_p3=300_000, ecn_marked_p3=5, max_held_p3=120_000, pause_tx_p3=2)]
    assert lossless_warnings(fine, ECN, pfc, {"max_s": 0.001, "max_fabric_us": 0.5}) == []
    (w,) = lossless_warnings([_row(lossless_drops=3)], ECN, pfc, None)
    assert "3 packet(s) dropped in the lossless class" in w and "buffer overflowed" in w
    (w,) = lossless_warnings([_row(max_backlog_p3=300_000)], ECN, pfc, None)
    assert "yet no packet was marked" in w
    assert lossless_warnings([_row(max_backlog_p3=200_000)], ECN, pfc, None) == []  # marks unlikely
    (w,) = lossless_warnings([_row(max_held_p3=100_000)], ECN, pfc, None)
    assert "yet no pause frame was sent" in w
    # A slow pause whose upstream sent nothing past the headroom changed nothing: no warning.
    assert lossless_warnings(fine, ECN, pfc, {"max_s": 0.01, "max_fabric_us": 5}) == []
    # Frames that came in past the headroom: the late pause is named once, with the port.
    late = [*fine, _row(headroom_overruns=2, max_held_p3=150_000)]
    (w,) = lossless_warnings(late, ECN, pfc, {"max_s": 0.0074, "max_fabric_us": 3.7})
    assert w.startswith("2 RoCE frame(s) arrived beyond xoff + headroom, most by leaf1-eth1") and "7.4 ms" in w
    assert "waiting" not in w  # no stall of the daemon's own timers to name
    # The machine stalled the daemon's own timers: said, so the user looks at the machine too.
    stalled = {"max_s": 0.0004, "max_fabric_us": 0.2, "late_wake": {"wakes": 900, "over_1ms": 3, "max_ms": 5.62}}
    (w,) = lossless_warnings(late, ECN, pfc, stalled)
    assert "the slowest took 0.4 ms; this machine left the PFC daemon waiting up to 5.6 ms past its own timers, 3 time(s)" in w
    off = PfcSettings(False, 100_000, 80_000, 0, 0xFFFF)
    assert lossless_warnings([_row(bpf_drops_p3=9, max_held_p3=10**6)], {"enabled": False}, off, None) == []


def test_show_prints_the_classes_and_thresholds_each_port_gets() -> None:
    import subprocess
    import sys

    repo = C_SOURCE.parents[3]
    r = subprocess.run([sys.executable, "-m", "fabric_emu", "show", "experiments/incast.yaml",
                        "--set", "pfc.xoff=120KB", "--set", "ecn.kmin=30KB"],
                       cwd=repo, capture_output=True, text=True, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "kmin 30KB, kmax 200KB, pmax 0.2" in out  # kmax scaled to the 500 KB buffer
    assert "xoff 120KB, xon 100KB, headroom 47.1KB per ingress port" in out
    assert "a pause of 65535 quanta lasts 335.54 us at 100 Gb/s (0.671 s emulated)" in out


def test_a_dead_or_failing_pfc_daemon_is_a_warning() -> None:
    from fabric_emu.results.switch import daemon_warnings

    assert daemon_warnings({"intervals": {}, "errors": []}) == []
    (w,) = daemon_warnings({"died": "exit code -9"})
    assert "stopped during the run (exit code -9)" in w
    (w,) = daemon_warnings({"errors": ["event X: [Errno 19] No such device"]})
    assert "failed to act on 1 event(s)" in w
    (w,) = daemon_warnings({"events_lost": 3})
    assert "fell behind: 3 threshold or pause event(s)" in w
    assert daemon_warnings({"events_lost": 0}) == []


def test_the_slowest_pause_is_split_into_its_stages() -> None:
    from fabric_emu.ports.pfcd import split_reaction
    from fabric_emu.results.switch import reaction_summary

    ms = 1_000_000
    split = split_reaction((0, 1 * ms), (2 * ms, 3 * ms), 10 * ms)  # a slow tc change
    assert split == {"total_s": 0.010, "to_daemon_s": 0.001, "frame_s": 0.001,
                     "frame_to_daemon_s": 0.001, "gate_s": 0.007}
    r = reaction_summary({"reaction_s": [0.001, 0.010], "worst_reaction": split}, 2000)
    assert r["max_s"] == 0.01 and r["slowest_ms"] == {"total": 10.0, "to_daemon": 1.0, "frame": 1.0,
                                                      "frame_to_daemon": 1.0, "gate": 7.0}


def test_a_pause_honoured_as_its_frame_is_sent_has_no_frame_stages() -> None:
    """Both ends on this machine: the gate closes as the frame leaves, not when it is seen."""
    from fabric_emu.ports.pfcd import split_reaction

    ms = 1_000_000
    split = split_reaction((0, 2 * ms), (None, None), 3 * ms)
    assert split == {"total_s": 0.003, "to_daemon_s": 0.002, "frame_s": 0.0,
                     "frame_to_daemon_s": 0.0, "gate_s": 0.001}


def test_each_stage_keeps_its_longest_over_every_pause() -> None:
    from fabric_emu.ports.pfcd import max_by_stage, split_reaction
    from fabric_emu.results.switch import reaction_summary

    ms = 1_000_000
    slow_gate = split_reaction((0, 1 * ms), (2 * ms, 3 * ms), 10 * ms)  # slowest in total
    slow_frame = split_reaction((0, 1 * ms), (6 * ms, 7 * ms), 8 * ms)  # its frame the latest
    stages = max_by_stage(max_by_stage({}, slow_gate), slow_frame)
    assert stages == {"total_s": 0.010, "to_daemon_s": 0.001, "frame_s": 0.005,
                      "frame_to_daemon_s": 0.001, "gate_s": 0.007}
    r = reaction_summary({"reaction_s": [0.008, 0.010], "worst_reaction": slow_gate, "stage_max": stages}, 2000)
    assert r["slowest_ms"]["frame"] == 1.0 and r["stage_max_ms"]["frame"] == 5.0
    assert reaction_summary({"reaction_s": [0.001]}, 2000).keys() == {
        "pauses_measured", "p50_s", "max_s", "p50_fabric_us", "max_fabric_us"}  # an older daemon's stats


def test_the_daemon_settles_its_heap_and_counts_full_collections() -> None:
    """After settle() a full collection walks only what was allocated since: short, and counted."""
    import gc

    from fabric_emu.ports.pfcd import FullCollections

    collections = FullCollections()
    try:
        collections.settle()
        assert gc.get_freeze_count() > 1000  # the test process's modules and objects
        gc.collect(1)  # not a full one: not counted
        gc.collect(2)
        report = collections.report()
        assert report["count"] == 1 and 0 <= report["longest_ms"] < 50, report
    finally:
        gc.callbacks.remove(collections._on_gc)
        gc.unfreeze()


def test_a_pause_from_another_machine_pauses_its_peer_here(tmp_path: Path) -> None:
    """Over several machines (issue 19) a pause frame names its sender by global id, a port
    the daemon here does not run: remote_peers maps it to the port here that it pauses."""
    from fabric_emu.ports.layout import NO_PORT
    from fabric_emu.ports.pfcd import Config, DaemonPort, paused_by

    def port(pid: int, peer: int) -> DaemonPort:
        return DaemonPort(pid, "spine1", f"spine1-eth{pid}", peer, "switch", 100.0, 1e7, 4200, 64000, None, True)

    ports = {5: port(5, 6), 6: port(6, 5), 7: port(7, 40)}  # 40: leaf2-eth3, on the other machine
    assert paused_by(ports, {}, 5) == 6
    assert paused_by(ports, {}, 40) == NO_PORT  # unknown here
    assert paused_by(ports, {40: 7}, 40) == 7
    assert paused_by(ports, {41: 99}, 41) == NO_PORT  # its peer is not here either
    cfg = Config(pins="/x", dilation=1000.0, quanta=0xFFFF, stats_path="/y", ports=list(ports.values()),
                 remote_peers={40: 7})
    (tmp_path / "c.json").write_text(cfg.dump())
    assert Config.load(str(tmp_path / "c.json")).remote_peers == {40: 7}


def test_the_daemons_of_several_machines_report_as_one() -> None:
    """Each machine's PFC daemon logs its own ports (issue 19): the run reports them as one."""
    from fabric_emu.ports.pfcd import merge_stats

    s1 = {"intervals": {"leaf1-eth5": [[0.1, 0.2]]}, "reaction_s": [0.001], "worst_reaction": {"total_s": 0.001},
          "stage_max": {"gate": 0.0002}, "longest_call_ms": {"frame": 0.1}, "frames_sent": 3, "frames_received": 1,
          "events": 10, "events_lost": 0, "errors": [], "watchdog": None, "storms": [], "storm_nic_drops": {},
          "nic_receive": None}
    s2 = {**s1, "intervals": {"spine2-eth1": [[0.3, 0.4]]}, "reaction_s": [0.004], "worst_reaction": {"total_s": 0.004},
          "stage_max": {"gate": 0.0001}, "frames_sent": 5, "errors": ["x"]}
    m = merge_stats([s1, {}, s2])
    assert m["intervals"] == {"leaf1-eth5": [[0.1, 0.2]], "spine2-eth1": [[0.3, 0.4]]}
    assert sorted(m["reaction_s"]) == [0.001, 0.004] and m["worst_reaction"] == {"total_s": 0.004}
    assert m["stage_max"] == {"gate": 0.0002} and m["frames_sent"] == 8 and m["errors"] == ["x"]
    assert m["late_wake"] is None  # neither daemon reported one
    s1["late_wake"] = {"wakes": 4, "over_1ms": 1, "max_ms": 1.5}
    s2["late_wake"] = {"wakes": 6, "over_1ms": 0, "max_ms": 0.3}
    assert merge_stats([s1, s2])["late_wake"] == {"wakes": 10, "over_1ms": 1, "max_ms": 1.5}
    assert merge_stats([{}, s1]) is s1 and merge_stats([]) == {}
