"""The event schedule (fabric_emu.fabric.events) and its spec validation, without a fabric."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from fabric_emu.spec.events import EventSpec
from fabric_emu.fabric.events import EventRunner, schedule
from fabric_emu.fabric.keeper import outage_row


def test_events_fire_in_time_order_at_go_plus_dilated_time():
    events = [EventSpec(at="500us", load_balancing="spray"), EventSpec(at=0, load_balancing="ecmp"),
              EventSpec(at="0.5ms", load_balancing="ecmp")]
    got = schedule(events, go=100.0, dilation=2000)
    assert [(s.index, round(s.wall_s, 9)) for s in got] == [(1, 100.0), (0, 101.0), (2, 101.0)]


@pytest.mark.parametrize("bad", [{"at": "-1us", "load_balancing": "spray"},
                                 {"at": "1us", "load_balancing": "flowlet"},
                                 {"at": "1us", "link": "leaf1-spine1"},
                                 {"at": "1us", "link": "leaf1-spine1", "state": "down", "gbps": 25},
                                 {"at": "1us", "gbps": 25},
                                 {"at": "1us", "link": "leaf1-spine1", "gbps": 0},
                                 {"at": "1us"},
                                 {"at": "1us", "load_balancing": "spray", "link": "leaf1-spine1"},
                                 {"at": "1us", "controller": "reboot"},
                                 {"at": "1us", "controller": "restart", "link": "leaf1-spine1", "state": "down"}])
def test_bad_events_are_rejected(bad):
    with pytest.raises(ValidationError):
        EventSpec(**bad)


def test_a_controller_event_calls_the_keeper_and_records_its_outage():
    calls = []

    def act(action: str) -> dict:
        calls.append(action)
        return {"cause": "event", "resynced": True, "outage_s": 1.5, "outage_fabric_us": 375.0, "per_switch": {}}

    e = EventSpec(at=0, controller="restart")
    assert e.kind == "controller"
    runner = EventRunner([e], 4000, "http://127.0.0.1:1/lb", controller=act)
    runner.start(go=0.0)  # long past: fires at once
    runner._thread.join(5)
    [row] = runner.stop()
    assert calls == ["restart"]
    assert row["ok"] and row["controller"] == "restart" and row["outage_fabric_us"] == 375.0
    assert "per_switch" not in row  # the summary's controller_outages has the details


def test_a_controller_event_that_fails_is_recorded_not_raised():
    def act(action: str) -> dict:
        raise RuntimeError("the controller is running already")

    runner = EventRunner([EventSpec(at=0, controller="start")], 4000, "", controller=act)
    runner.start(go=0.0)
    runner._thread.join(5)
    [row] = runner.stop()
    assert not row["ok"] and "running already" in row["error"]


def test_outage_row_from_the_ready_file():
    ready = {"time": 112.0, "syncs": {
        "0x1001": {"flows_added": 0, "flows_kept": 20, "groups_kept": 1, "messages": 0},
        "0x5001": {"flows_deleted": 2, "flows_kept": 17, "messages": 2, "cold": False}}}
    row = outage_row("crashed", down_wall=110.0, listening_wall=110.5, ready=ready, go=108.0, dilation=4000)
    assert row["cause"] == "crashed" and row["down_s"] == 2.0 and row["down_fabric_us"] == 500.0
    assert row["outage_s"] == 2.0 and row["outage_fabric_us"] == 500.0 and row["resynced_s"] == 4.0
    assert row["switches"] == 2 and row["cold_starts"] == 0
    assert row["warm_start"]["flows_deleted"] == 2 and row["warm_start"]["flows_kept"] == 37
    assert row["warm_start"]["messages"] == 2
    assert row["per_switch"]["0x1001"] == {"flows_kept": 20, "groups_kept": 1}
    lost = outage_row("event", 110.0, None, None, 108.0, 4000)
    assert lost == {"cause": "event", "down_s": 2.0, "down_fabric_us": 500.0, "resynced": False}


def test_the_summary_table_shows_each_outage():
    from fabric_emu.results.table import summary_rows

    ready = {"time": 112.0, "syncs": {"0x1001": {"flows_kept": 20, "messages": 0}}}
    rows = summary_rows({"status": "ok", "workload": "allreduce/ring", "controller_outages": [
        outage_row("event", 110.0, 110.5, ready, 108.0, 4000), outage_row("crashed", 113.0, None, None, 108.0, 4000)]})
    shown = [r for r in rows if r[0].startswith("controller outage")]
    assert shown == [("controller outage (event, at 500 us)", "500 us", "2.00 s; resync sent 0 msgs, 0 flow deletions"),
                     ("controller outage (crashed, at 1,250 us)", "not back by the end", "")]
