"""The summary's PFC rows, read as a student reads them (issue 21): when the switches paused the
NICs, the table once said "PFC pause frames sent / received: 39 / 0" and "time paused (all
ports): 0.0 us", which reads as 39 pauses that paused nothing."""

from __future__ import annotations

from fabric_emu.results.table import summary_rows

SWITCH = {"tx_packets": 1000, "drops": 0, "ecn_marked": 5, "pause_tx": 39, "pause_rx": 0,
          "paused_fabric_us": 0.0, "lossless_drops": 0, "headroom_overruns": 0}
NIC = {"pause_rx": 39, "paused_fabric_us": 812.5, "nics_paused": 3}


def rows_of(summary: dict) -> dict[str, tuple[str, str]]:
    return {metric: (modelled, emulated) for metric, modelled, emulated in summary_rows(summary)}


def test_pauses_the_switches_sent_to_nics_show_on_the_nics_side():
    rows = rows_of({"status": "ok", "workload": "flows", "dilation": 4000, "switch": SWITCH, "nic": NIC})
    assert rows["PFC pauses sent by switches"][0] == "39"
    # Every frame sent was received by someone: here, all by the NICs.
    assert rows["PFC pauses received: switches / NICs"][0] == "0 / 39"
    # The time paused is the NICs', not the switch ports'; each side has its own figure.
    modelled, emulated = rows["time paused (sum): switches / NICs"]
    assert modelled == "0.0 / 812.5 us"
    assert emulated == "0.000 / 3.250 s"  # 812.5 us x 4000
    assert not any("all ports" in m for m in rows)


def test_a_summary_without_the_nics_side_says_it_is_unknown():
    rows = rows_of({"status": "ok", "workload": "flows", "dilation": 4000, "switch": SWITCH})
    assert rows["PFC pauses received: switches / NICs"][0] == "0 / ?"
    assert rows["time paused (sum): switches / NICs"][0] == "0.0 / ? us"


def test_a_storm_and_the_watchdog_have_rows_of_their_own():
    """The watchdog's drops are among "switch drops": its rows say how many were its own."""
    wd = {"action": "drop", "storms_detected": 1, "storms_restored": 1, "queues_stormed": ["leaf2-eth1"],
          "tx_dropped_packets": 1827, "rx_dropped_packets": 0}
    storms = [{"nic": "h4", "on_fabric_us": 1000.2, "off_fabric_us": 3000.1, "pause_frames_sent": 12}]
    rows = rows_of({"status": "ok", "workload": "flows", "dilation": 2000, "switch": {**SWITCH, "drops": 1827},
                    "nic": NIC, "pfc_storms": storms, "pfcwd": wd})
    assert rows["PFC storm of h4's NIC"][0] == "1,000 to 3,000 us, 12 pauses"
    assert rows["PFC watchdog (drop): storms detected / restored"][0] == "1 / 1"
    assert rows["PFC watchdog: queues stormed"][0] == "leaf2-eth1"
    assert rows["PFC watchdog: packets dropped out / in"][0] == "1,827 / 0"
    assert not any("watchdog" in m for m in rows_of({"status": "ok", "workload": "flows", "dilation": 1,
                                                      "switch": SWITCH}))
