"""The PFC daemon's record of late pauses (fabric_emu.ports.late_pauses): pure bookkeeping."""

from fabric_emu.ports import late_pauses
from fabric_emu.ports.late_pauses import LatePauses

MS = 1_000_000


def test_a_pause_within_the_bar_is_not_kept():
    log = LatePauses()
    log.pause(0, MS, {"total_s": 1e-3})
    assert log.report() == {"count": 0, "slowest": []}
    log.pause(0, MS + 1, {"total_s": 1e-3})
    assert log.report()["count"] == 1


def test_a_late_pause_keeps_the_long_calls_of_its_round_even_those_ending_after_it():
    log = LatePauses()
    log.call("frame", 10 * MS, 10 * MS + 100_000)  # short: not kept
    log.call("frame", 100 * MS, 108 * MS)  # overlaps the pause
    log.call("gate", 90 * MS, 91 * MS)  # before the pause: not its
    log.pause(101 * MS, 109 * MS, {"total_s": 8e-3, "to_daemon_s": 7e-3, "gate_s": 1e-3, "frame_s": 0.0})
    assert log.slowest == []  # its round is not over
    log.call("loop", 99 * MS, 110 * MS)  # the round ends
    (entry,) = log.report()["slowest"]
    assert entry["ms"] == 8.0 and entry["at_monotonic_ns"] == 101 * MS
    assert entry["stages_ms"] == {"to_daemon": 7.0, "gate": 1.0}
    assert entry["daemon_ms"] == [["loop", -2.0, 9.0], ["frame", -1.0, 7.0]]


def test_only_the_slowest_are_kept_but_every_late_one_is_counted():
    log = LatePauses()
    for i in range(late_pauses.KEPT + 5):
        log.pause(0, (2 + i) * MS, {"total_s": (2 + i) / 1e3})
    report = log.report()
    assert report["count"] == late_pauses.KEPT + 5
    assert [e["ms"] for e in report["slowest"]] == [float(2 + i) for i in reversed(range(5, late_pauses.KEPT + 5))]


def test_daemons_on_several_machines_merge_into_one_report():
    a, b = LatePauses(), LatePauses()
    a.pause(0, 3 * MS, {"total_s": 3e-3})
    b.pause(0, 5 * MS, {"total_s": 5e-3})
    merged = late_pauses.merge([{"late_pauses": a.report()}, {"late_pauses": b.report()}, {}])
    assert merged is not None and merged["count"] == 2 and [e["ms"] for e in merged["slowest"]] == [5.0, 3.0]
    assert late_pauses.merge([{}, {"late_pauses": None}]) is None
