"""Pauses keep time under CPU load (issue 20, part 4): the PFC incast (experiments/incast.yaml,
~1,200 pauses a run) three times with two busy loops beside it, as the test suite's own load.

Judged on what was measured: the slowest pause (summary.json pfc_reaction.max_s, the kernel's
xoff crossing to the upstream gate closed) within the time the run's headroom buys (headroom
bytes at the link rate, times the dilation: what a pause may take before frames come in past
it) in two runs of three, and in every run nothing lost: a frame past the headroom
(headroom_overruns, counted by the port programs) is kept and reported.
Not against a fixed 1 ms: that is issue 20's bar, measured by benchmarks/pause_load.py (20 runs
with two busy loops, with the PFC responder: all within 1 ms, the slowest 0.64 ms, against the
headroom's 7.5 ms).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from fabric_emu.measure.thread_cpu import children_of
from tests.integration.fabric_checks import late_pauses_said, read_json, run_shipped

pytestmark = [pytest.mark.root, pytest.mark.slow]

RUNS = 3
BUSY_LOOPS = 2


@pytest.fixture(scope="module")
def loaded_incasts(tmp_path_factory) -> list[tuple[dict, dict]]:
    """(summary.json, experiment.yaml as run) of each incast, run with the busy loops beside it."""
    loops = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(BUSY_LOOPS)]
    try:
        runs = [run_shipped(tmp_path_factory, "incast") for _ in range(RUNS)]
    finally:
        for p in loops:
            p.send_signal(signal.SIGTERM)
            p.wait()
    return [(read_json(d / "summary.json"), yaml.safe_load((d / "experiment.yaml").read_text())) for d, _ in runs]


def headroom_s(summary: dict, spec: dict) -> float:
    """Emulated seconds the headroom buys: its bytes at the slower link's rate, dilated."""
    gbps = min(spec["topology"]["host_link"]["gbps"], spec["topology"]["fabric_link"]["gbps"])
    return spec["pfc"]["headroom"] * 8 / (gbps * 1e9) * summary["dilation"]


def test_the_slowest_pause_stays_within_the_headroom_under_two_busy_loops(loaded_incasts):
    """In two runs of three at least: the tail left is the kernel's (issue 20 part 4 is open),
    the daemon's wake-up behind receive work its own calls ran (slowest 3.9 ms in 20 runs of
    benchmarks/pause_load.py here; a CI run before the gates stopped waiting for frames, 9.5 ms)."""
    late = []
    for summary, spec in loaded_incasts:
        assert summary["status"] == "ok", summary.get("status")
        reaction = summary["pfc_reaction"]
        assert reaction["pauses_measured"] > 100, reaction  # the incast did pause, hard
        budget = headroom_s(summary, spec)
        if reaction["max_s"] >= budget:
            late.append((reaction, budget))
        # where the slowest went adds up: the stages split the measured total
        split = reaction["slowest_ms"]
        stages = split["to_daemon"] + split["frame"] + split["frame_to_daemon"] + split["gate"]
        assert stages == pytest.approx(split["total"], abs=0.005), split
    assert len(late) <= 1, late


def test_under_two_busy_loops_nothing_is_lost_and_a_frame_past_the_headroom_is_reported(loaded_incasts):
    """No frame past the headroom is issue 20 part 4's bar, not yet met on this kernel: CI
    rehearsals found 15 such frames in one run in three (its slowest pause 2.9 ms, inside the
    7.5 ms the headroom buys, so the pause's reaction is not all of it). What a run must do is
    keep them (no lossless drop) and say so, as the one-machine incast test asks; the bar itself
    is measured by benchmarks/pause_load.py."""
    for summary, _ in loaded_incasts:
        switch = summary["switch"]
        assert switch["pause_tx"] > 0, switch  # the switches paused: the counts below had a chance
        assert switch["lossless_drops"] == 0, switch
        if late_pauses_said(summary):
            assert not summary["fidelity"]["trusted"], summary["fidelity"]


def test_every_pause_past_1_ms_is_recorded_with_its_stages(loaded_incasts):
    """pfc_reaction.late is there exactly when the slowest pause took more than 1 ms, and its
    slowest entry is that pause, measured by the daemon at the same crossing and gate: same
    total, stages that add up to it. Three runs under busy loops had at least one late pause in
    nearly every CI rehearsal; a batch with none still checks that nothing is made up (the test
    below makes late pauses on purpose, and judges them by its own clock)."""
    for summary, _ in loaded_incasts:
        reaction = summary["pfc_reaction"]
        if reaction["max_s"] * 1e3 <= 1.0:
            assert "late" not in reaction, reaction
            continue
        late = reaction["late"]
        assert 1 <= len(late["slowest"]) <= late["count"], late
        worst = late["slowest"][0]
        assert worst["ms"] == pytest.approx(reaction["max_s"] * 1e3, abs=0.002), (worst, reaction)
        assert sum(worst["stages_ms"].values()) == pytest.approx(worst["ms"], abs=0.005), worst
        assert all(e["ms"] > 1.0 for e in late["slowest"]), late


STOP_S, EVERY_S = 0.05, 0.2  # stops far longer than the machine's own stalls
MS = 1_000_000


def _daemons() -> set[int]:
    """The pids of PFC daemons running now (fabric_emu.ports.pfcd, started by the port runtime)."""
    pids = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and b"fabric_emu.ports.pfcd" in (entry / "cmdline").read_bytes():
                pids.add(int(entry.name))
        except OSError:  # gone meanwhile
            pass
    return pids


def _is_responder(pid: int) -> bool:
    """Not clang, which the daemon runs first when responder.c changed since its last build."""
    try:
        return Path(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()).name.startswith("responder")
    except OSError:
        return False


def _stop_now_and_then(done: threading.Event, windows: list[tuple[int, int]], which: str) -> None:
    """Stop the run's PFC daemon, its responder or both (`which`: "daemon", "responder", "both";
    SIGSTOP) for STOP_S every EVERY_S until `done`, recording each stop's CLOCK_MONOTONIC start
    and end (the clock the port programs stamp crossings with)."""
    before = _daemons()
    pid = None
    while not done.is_set() and pid is None:
        pid = next(iter(_daemons() - before), None)
        time.sleep(0.05)
    if pid is not None and which == "responder":  # the daemon starts it once it has booted
        daemon, pid = pid, None
        while not done.is_set() and pid is None:
            pid = next((c for c in children_of(daemon) if _is_responder(c)), None)
            time.sleep(0.05)
    signal_it = os.killpg if which == "both" else os.kill  # the daemon leads a process group of the two
    while pid is not None and not done.wait(EVERY_S):
        try:
            start = time.monotonic_ns()
            signal_it(pid, signal.SIGSTOP)
            time.sleep(STOP_S)
        except ProcessLookupError:  # the run is over
            return
        finally:
            end = time.monotonic_ns()
            with contextlib.suppress(ProcessLookupError):
                signal_it(pid, signal.SIGCONT)
        windows.append((start, end))


def _incast_with_stops(tmp_path_factory, which: str) -> tuple[dict, list[tuple[int, int]]]:
    """The incast's summary.json, with its daemon or responder stopped now and then, and the stops."""
    done, windows = threading.Event(), []
    stopper = threading.Thread(target=_stop_now_and_then, args=(done, windows, which))
    stopper.start()
    try:
        run_dir, r = run_shipped(tmp_path_factory, "incast")
    finally:
        done.set()
        stopper.join()
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert len(windows) > 10, windows  # the daemon was found and stopped, many times
    summary = read_json(run_dir / "summary.json")
    assert summary["status"] == "ok", summary["status"]
    return summary, windows


def test_a_pause_the_daemon_and_its_responder_were_stopped_for_is_recorded_late_and_closed_once_let_go(
        tmp_path_factory):
    """The incast with its PFC daemon and responder stopped for 50 ms every 200 ms: a pause that
    met a stop cannot take effect before the test lets them go. Judged against the test's own
    clock: the slowest late pauses (pfc_reaction.late) are pauses that met a stop, and each closed
    only after that stop ended (no gate closes while both are stopped), whatever the machine did
    besides."""
    summary, windows = _incast_with_stops(tmp_path_factory, "both")
    reaction = summary["pfc_reaction"]
    late = reaction.get("late")
    assert late and late["count"] >= len(late["slowest"]) > 0, reaction
    for e in late["slowest"]:
        crossed, closed = e["at_monotonic_ns"], e["at_monotonic_ns"] + e["ms"] * MS
        met = [(start, end) for start, end in windows if crossed < end and closed > start]
        assert len(met) == 1, (e, windows)  # it met one stop (they are 150 ms apart)
        assert closed >= met[0][1] - 0.002 * MS, (e, met)  # ms is rounded to the microsecond


def test_pauses_take_effect_while_the_daemon_alone_is_stopped(tmp_path_factory):
    """The same stops of the daemon alone: its responder closes each local upstream's gate on the
    crossing without it (issue 20 part 4), so no pause waits for a stop to end. A quarter of the
    run is stopped time; the slowest pause stays far below one stop, and the incast loses nothing."""
    summary, windows = _incast_with_stops(tmp_path_factory, "daemon")
    reaction = summary["pfc_reaction"]
    assert reaction["pauses_measured"] > 100, reaction
    assert reaction["responder"]["fast_closes"] > 100, reaction  # closed by the responder, not the daemon
    assert reaction["max_s"] < STOP_S / 5, reaction
    assert summary["switch"]["lossless_drops"] == 0, summary["switch"]


def test_a_late_fast_close_never_undoes_the_daemons_reopening(tmp_path_factory):
    """The same stops of the responder alone: each time it is let go it finds the crossings of
    the stop waiting in its ring and the daemon's commands in its socket, among them reopenings
    of the gates those crossings would close, answered by XONs meanwhile. A gate takes no change
    older than the last it took, so those closes are refused and counted, and the incast
    completes, lossless. (The rule itself is tests/unit/test_responder.py's: with it off, this
    run still completed in the one try made, the two threads having taken most late closes
    before the commands that superseded them.)"""
    summary, _ = _incast_with_stops(tmp_path_factory, "responder")
    reaction = summary["pfc_reaction"]
    assert reaction["responder"]["stale"] > 0, reaction  # the stops did make late closes
    assert summary["switch"]["lossless_drops"] == 0, summary["switch"]
