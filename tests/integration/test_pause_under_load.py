"""Pauses keep time under CPU load (issue 20, part 4): the PFC incast (experiments/incast.yaml,
~1,200 pauses a run) three times with two busy loops beside it, as the test suite's own load.

Judged per run on what was measured: the slowest pause (summary.json pfc_reaction.max_s, the
kernel's xoff crossing to the upstream gate closed) within the time the run's headroom buys
(headroom bytes at the link rate, times the dilation: what a pause may take before frames come
in past it), and no frame past the headroom (headroom_overruns, counted by the port programs).
Not against a fixed 1 ms: a loaded 2-core CI machine is allowed its tail, the headroom is not.
Measured here: slowest 0.3 to 0.5 ms against the headroom's 7.5 ms (benchmarks/pause_load.py).
"""

from __future__ import annotations

import signal
import subprocess

import pytest
import yaml

from tests.integration.fabric_checks import read_json, run_shipped

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
    for summary, spec in loaded_incasts:
        assert summary["status"] == "ok", summary.get("status")
        reaction = summary["pfc_reaction"]
        assert reaction["pauses_measured"] > 100, reaction  # the incast did pause, hard
        budget = headroom_s(summary, spec)
        assert reaction["max_s"] < budget, (reaction, budget)
        # where the slowest went adds up: the stages split the measured total
        split = reaction["slowest_ms"]
        stages = split["to_daemon"] + split["frame"] + split["frame_to_daemon"] + split["gate"]
        assert stages == pytest.approx(split["total"], abs=0.005), split


def test_no_frame_came_in_past_the_headroom_under_two_busy_loops(loaded_incasts):
    for summary, _ in loaded_incasts:
        switch = summary["switch"]
        assert switch["pause_tx"] > 0, switch  # the switches paused: the count below had a chance
        assert switch["headroom_overruns"] == 0, switch
        assert switch["lossless_drops"] == 0, switch
