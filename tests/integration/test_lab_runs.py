"""A lab's runs share one fabric: each run's figures must be its own.

The situation a new user met (issue 21): in a lab of the ECMP-collision experiment, `run as
ecmp` paused the NICs (two flows on one uplink), then `lb spray` and `run as spray` warned "PFC is
on and leaf1-eth2 held 108004 B of RoCE (xoff 100000 B), yet no pause frame was sent". No pause
was missed: the ports' high-water marks (deepest queue, most bytes held) were read as they stood,
since the fabric came up, so the spray run reported the ECMP run's maximum. They are now zeroed
when each run's traffic starts.
"""

from __future__ import annotations

import pytest

from fabric_emu.run.prepare import load_checked
from tests.integration.fabric_checks import REPO, fabric_emu, leftovers, read_csv, read_json

pytestmark = [pytest.mark.root, pytest.mark.slow]

COLLISION = REPO / "experiments" / "ecmp-collision.yaml"
MISSED = "yet no pause frame was sent"


def test_a_labs_second_run_reports_its_own_queues_not_the_first_runs(tmp_path):
    _, plan, _ = load_checked(COLLISION, [])
    assert leftovers(plan) == [], "machine not clean before the test"
    script = tmp_path / "collision.lab"
    script.write_text("run as ecmp\nlb spray\nrun as spray\n")
    r = fabric_emu("lab", str(COLLISION), "--script", str(script), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert leftovers(plan) == []
    first, second = sorted((tmp_path / "out" / "ecmp-collision").iterdir())
    xoff = min(int(t["xoff"]) for t in read_csv(first / "thresholds.csv"))  # what the ports ran with
    ecmp, spray = read_json(first / "summary.json"), read_json(second / "summary.json")
    assert (ecmp["load_balancing"], spray["load_balancing"]) == ("ecmp", "spray")

    # The situation: the ECMP run filled a port's lossless share past xoff, and paused.
    ecmp_ports = read_csv(first / "ports.csv")
    assert ecmp["switch"]["pause_tx"] > 0, ecmp["switch"]
    assert max(int(p["max_held_p3"]) for p in ecmp_ports) >= xoff

    # The spray run's marks are its own: every port that held xoff or more sent a pause, and the
    # check that says otherwise stays quiet.
    spray_ports = read_csv(second / "ports.csv")
    full = [p for p in spray_ports if int(p["max_held_p3"]) >= xoff]
    assert all(int(p["pause_tx_p3"]) > 0 for p in full), full
    assert not [w for w in spray["fidelity"]["warnings"] if MISSED in w], spray["fidelity"]["warnings"]
    # Spraying four flows over four uplinks holds far less than two flows on one uplink did.
    assert max(int(p["max_held_p3"]) for p in spray_ports) < max(int(p["max_held_p3"]) for p in ecmp_ports)
