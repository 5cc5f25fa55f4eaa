"""The default deadline (fabric_emu.run.deadline) and the report of a run it cut short
(fabric_emu.results.deadline)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabric_emu.results.deadline import LOSSY_RETRANSMIT_TIMEOUT_S, cut_by_deadline, deadline_report
from fabric_emu.run.deadline import (DEFAULT_TIMEOUT_BASE_S, default_timeout_s, loss_allowance_s,
                                     losses_possible, timeout_rounds)
from fabric_emu.run.prepare import load_checked

REPO = Path(__file__).resolve().parents[2]
RTO = 4.194304e-3  # the transport's default


def test_rounds_are_one_per_port_buffer_of_the_bottleneck_plus_the_retry_limit():
    assert timeout_rounds(7_000_000, 400_000, 7) == 18 + 7  # 17.5 buffers, rounded up
    assert timeout_rounds(400_000, 400_000, 7) == 1 + 7
    assert timeout_rounds(0, 400_000, 3) == 3
    assert loss_allowance_s(7_000_000, 400_000, RTO, 7) == pytest.approx(25 * RTO)


def test_only_lossy_runs_get_the_allowance_in_wall_time():
    lossless = default_timeout_s(1.12, 2000)
    assert lossless == pytest.approx(DEFAULT_TIMEOUT_BASE_S + 10 * 1.12)
    assert default_timeout_s(1.12, 2000, lossy=False, bottleneck_bytes=7e6, port_buffer=400_000,
                             retransmit_timeout_s=RTO, retry_limit=7) == lossless
    lossy = default_timeout_s(1.12, 2000, lossy=True, bottleneck_bytes=7e6, port_buffer=400_000,
                              retransmit_timeout_s=RTO, retry_limit=7)
    assert lossy == pytest.approx(lossless + 25 * RTO * 2000)  # modelled timeouts x dilation


def test_losses_are_possible_without_pfc_or_with_a_watchdog_that_drops():
    assert not losses_possible(True)
    assert losses_possible(False)
    assert losses_possible(True, True, "drop") and losses_possible(True, True, "forward")
    assert not losses_possible(True, True, "alert") and not losses_possible(True, False, "drop")


def test_default_timeouts_of_shipped_experiments():
    # 7 x 1 MB into h1 at dilation 2000: 1.12 s at line rate; 400 KB buffer, the default 4.2 ms timer
    spec, plan, _ = load_checked(REPO / "experiments" / "incast-lossy-rto.yaml", [])
    assert spec.timeout == pytest.approx(30 + 11.2 + (18 + 7) * RTO * 2000)  # 250.9 s
    # the lossless incast keeps 30 s + 10x line rate (28 MB: 4.48 s)
    spec, _, _ = load_checked(REPO / "experiments" / "incast.yaml", [])
    assert spec.timeout == pytest.approx(30 + 44.8)
    # incast-lossy.yaml: 200 KB buffer, 262 us timer
    spec, _, _ = load_checked(REPO / "experiments" / "incast-lossy.yaml", [])
    assert spec.timeout == pytest.approx(30 + 11.2 + (35 + 7) * 262.144e-6 * 2000)
    # a timeout given is kept
    spec, _, _ = load_checked(REPO / "experiments" / "incast-lossy-rto.yaml", ["timeout=60s"])
    assert spec.timeout == 60


# ---------------------------------------------------------------- the report of a cut run

GO = 1000.0
DIL = 2000.0
WINDOW = 2 * RTO * DIL  # 16.8 s of wall time


def agents(*, rx: list, last_tx: float | None, timeouts: int = 3, end: float = GO + 100) -> dict:
    """A receiver h1 with one receive QP (rx: its rx_series) and a sender h2 cut by the deadline."""
    return {
        "h1": {"status": "incomplete", "error": "timeout", "go": GO, "end": end, "send_qps": [],
               "recv_qps": [{"bytes": rx[-1][1] if rx else 0, "rx_series": rx}]},
        "h2": {"status": "incomplete", "error": "timeout", "go": GO, "end": end, "recv_qps": [],
               "send_qps": [{"timeouts": timeouts, "last_tx": last_tx}]},
    }


def report(a: dict, **kw) -> dict | None:
    args = {"timeout_s": 100.0, "dilation": DIL, "retransmit_timeout_s": RTO, "lossy": True,
            "planned_bytes": 1_000_000, **kw}
    return deadline_report(a, **args)


def test_a_run_that_finished_or_failed_otherwise_has_no_report():
    done = agents(rx=[[GO + 1, 1000]], last_tx=GO + 1)
    for a in done.values():
        a.update(status="ok", error=None)
    assert not cut_by_deadline(done) and report(done) is None
    failed = agents(rx=[[GO + 1, 1000]], last_tx=GO + 1)
    failed["h2"]["error"] = "QP 0x1 to h1: transport retry limit exceeded"
    failed["h1"]["error"] = "killed"
    assert report(failed) is None


def test_still_progressing_suggests_a_timeout_and_a_shorter_timer():
    # 500 KB by 80 s, 600 KB at 95 s: 100 KB in the last 16.8 s of a 100 s run
    a = agents(rx=[[GO + 10, 200_000], [GO + 80, 500_000], [GO + 95, 600_000]], last_tx=GO + 96)
    r = report(a)
    assert r["progressing"] and r["bytes_in_window"] == 100_000
    # the other 400 KB at 100 KB per 16.8 s: 67 s more; x 1.5 = 251 s, above 2 x 100 s
    assert r["suggested_timeout_s"] == 260
    assert r["suggested_retransmit_timeout_s"] == LOSSY_RETRANSMIT_TIMEOUT_S
    m = r["message"]
    assert m.startswith("cut short by its deadline (100s wall, 50.0 ms modelled) while flows were still progressing")
    assert "100.0 KB delivered in its last 8.4 ms modelled" in m and "60% of the planned bytes" in m
    assert "3 retransmission timeouts" in m and "2 of 2 hosts unfinished" in m
    assert "--set timeout=260s" in m and "--set transport.retransmit_timeout=262.144us" in m


def test_no_timer_advice_with_pfc_or_a_short_timer_or_no_timeouts():
    a = agents(rx=[[GO + 99.9, 600_000]], last_tx=GO + 99.9)  # within 2 timeouts of either timer
    for kw in ({"lossy": False}, {"retransmit_timeout_s": LOSSY_RETRANSMIT_TIMEOUT_S}):
        r = report(a, **kw)
        assert r["progressing"] and "retransmit_timeout" not in r["message"] and "suggested_retransmit_timeout_s" not in r
    r = report(agents(rx=[[GO + 90, 600_000]], last_tx=GO + 96, timeouts=0))
    assert "retransmit_timeout" not in r["message"]
    # at least double the deadline, even when the rest looks quick
    assert r["suggested_timeout_s"] == 200


def test_nothing_moved_says_stuck_not_slow():
    a = agents(rx=[[GO + 10, 200_000], [GO + 40, 300_000]], last_tx=GO + 41)
    r = report(a)
    assert not r["progressing"] and "suggested_timeout_s" not in r
    assert r["idle_fabric_s"] == pytest.approx(60 / DIL)
    assert r["message"] == ("cut short by its deadline (100s wall, 50.0 ms modelled): nothing was delivered in its "
                            "last 30.0 ms modelled and no packet was sent in its last 8.4 ms modelled: the flows "
                            "were stuck, not slow, and more time would not help")


def test_a_deadlock_at_the_end_is_named():
    r = report(agents(rx=[[GO + 10, 200_000]], last_tx=GO + 95), lossy=False, deadlocked_at_end=True)
    assert "it ended deadlocked (see deadlocks): more time would not help" in r["message"]
    assert "nothing was delivered in its last 45.0 ms modelled" in r["message"]


def test_retrying_without_progress():
    r = report(agents(rx=[[GO + 10, 200_000]], last_tx=GO + 95, timeouts=6))
    assert "though QPs were still sending (6 retransmission timeouts)" in r["message"]
    assert "retrying without progress" in r["message"]


def test_nothing_ever_delivered_counts_from_go():
    r = report(agents(rx=[], last_tx=None))
    assert r["idle_fabric_s"] == pytest.approx(100 / DIL) and not r["progressing"]
