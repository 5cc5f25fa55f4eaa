"""The event schedule (fabric_emu.fabric.events) and its spec validation, without a fabric."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from fabric_emu.spec.events import EventSpec
from fabric_emu.fabric.events import schedule


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
                                 {"at": "1us", "load_balancing": "spray", "link": "leaf1-spine1"}])
def test_bad_events_are_rejected(bad):
    with pytest.raises(ValidationError):
        EventSpec(**bad)
