"""The default deadline allows for retransmission timeouts: a 7:1 incast with PFC off, a 400 KB
port buffer and the default transport (RoCE's 4.2 ms timer) completes `ok` without a `timeout`
of its own (experiments/incast-lossy-rto.yaml). Measured over three runs: 4 to 6 rounds of
timeouts (19 to 35 in all), done after 17 to 26 ms modelled (35 to 52 s of wall time at dilation
2000); the deadline is 250.9 s (125.5 ms modelled), where without the allowance it was 41.2 s
(20.6 ms modelled), which cut the slower runs short."""

from __future__ import annotations

import time

import pytest
import yaml

from fabric_emu.run.deadline import DEFAULT_TIMEOUT_BASE_S
from fabric_emu.run.prepare import load_checked
from tests.integration.fabric_checks import REPO, read_json, run_shipped

pytestmark = [pytest.mark.root, pytest.mark.slow]

NAME = "incast-lossy-rto"


@pytest.fixture(scope="module")
def lossy_rto(tmp_path_factory):
    t = time.monotonic()
    run_dir, r = run_shipped(tmp_path_factory, NAME)
    return run_dir, r, time.monotonic() - t


def test_the_default_deadline_allows_for_retransmission_timeouts(lossy_rto):
    run_dir, r, wall_s = lossy_rto
    assert r.returncode == 0, r.stdout + r.stderr
    s = read_json(run_dir / "summary.json")
    assert s["status"] == "ok", s.get("error")
    t = s["transport"]
    assert t["bytes_received"] == s["bytes_planned"] == 7_000_000
    assert all(f["bytes_received"] == f["bytes_planned"] for f in s["flows"])
    assert t["timeouts"] > 0 and s["switch"]["drops"] > 0  # it really waited for the timer
    spec, plan, _ = load_checked(REPO / "experiments" / f"{NAME}.yaml", [])
    assert spec.transport.retransmit_timeout == pytest.approx(4.194304e-3)  # the default transport
    deadline = yaml.safe_load((run_dir / "experiment.yaml").read_text())["timeout"]
    assert deadline == pytest.approx(spec.timeout)
    without_allowance = DEFAULT_TIMEOUT_BASE_S + 10 * 7e6 * 8 / plan.host_rate_bps("h1")
    # the traffic outlasted the old default (30 s + 10x line rate): only the allowance let it finish
    traffic_s = read_json(run_dir / "metadata.json")["phases_s"]["traffic"]
    print(f"deadline {deadline:.1f} s wall ({deadline / plan.dilation * 1e3:.1f} ms modelled), "
          f"traffic {traffic_s:.1f} s, run {wall_s:.1f} s, jct {s['jct_fabric_s'] * 1e3:.1f} ms modelled, "
          f"{t['timeouts']} timeouts, {s['switch']['drops']} drops")
    assert deadline > without_allowance
    assert traffic_s < deadline
