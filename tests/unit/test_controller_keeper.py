"""The controller keeper (fabric_emu.fabric.keeper) with a stand-in controller: a small process
that listens where the real one would and writes the ready file, as the os-ken app does once
every switch answered its barrier."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from fabric_emu.fabric.controller import ControllerProcess, _spawn, free_tcp_port
from fabric_emu.fabric.keeper import ControllerKeeper

STAND_IN = """
import json, os, socket, sys, time
port, ready = int(sys.argv[1]), sys.argv[2]
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port)); s.listen()
time.sleep(0.2)  # the switches reconnect and are resynchronised
tmp = ready + ".tmp"
open(tmp, "w").write(json.dumps({"dpids": [1], "time": time.time(),
                                 "syncs": {"0x1": {"flows_kept": 5, "messages": 0, "cold": False}}}))
os.replace(tmp, ready)
time.sleep(60)
"""


class _Record:
    def __init__(self) -> None:
        self.pids: list[int] = []

    def add_process(self, pid: int, role: str) -> None:
        self.pids.append(pid)


@pytest.fixture
def ctrl(tmp_path: Path):
    port = free_tcp_port()
    ready = tmp_path / "controller.ready"
    cmd = (sys.executable, "-c", STAND_IN, str(port), str(ready))
    c = ControllerProcess(_spawn(list(cmd), tmp_path / "controller.log"), port, ready, tmp_path / "controller.log",
                          cmd=cmd)
    c.wait_ready(10)
    yield c
    c.kill()


def test_a_restart_event_kills_starts_and_records_the_outage(ctrl):
    record, said = _Record(), []
    keeper = ControllerKeeper(ctrl, record, dilation=4000, say=said.append)
    keeper.start_watching(time.time())
    first = ctrl.pid
    row = keeper.act("restart")
    assert ctrl.pid != first and record.pids == [ctrl.pid] and ctrl.proc.poll() is None
    assert row["cause"] == "event" and row["resynced"] and row["switches"] == 1
    assert 0.2 <= row["outage_s"] < 10 and row["warm_start"]["messages"] == 0
    assert keeper.stop() == [row]


def test_a_controller_that_dies_on_its_own_is_restarted(ctrl):
    said: list[str] = []
    keeper = ControllerKeeper(ctrl, _Record(), dilation=4000, say=said.append)
    keeper.start_watching(time.time())
    first = ctrl.pid
    ctrl.proc.kill()
    deadline = time.time() + 15
    while not keeper.outages and time.time() < deadline:
        time.sleep(0.05)
    [outage] = keeper.stop()
    assert outage["cause"] == "crashed" and outage["resynced"] and ctrl.pid != first
    assert any("died on its own" in s for s in said)


def test_stop_holds_it_down_until_start(ctrl):
    keeper = ControllerKeeper(ctrl, _Record(), dilation=4000, say=lambda s: None)
    keeper.start_watching(time.time())
    keeper.act("stop")
    time.sleep(0.6)  # the watch must not restart a controller stopped on purpose
    assert ctrl.proc.poll() is not None and not keeper.outages
    with pytest.raises(RuntimeError, match="stopped already"):
        keeper.act("stop")
    row = keeper.act("start")
    assert row["resynced"] and row["outage_s"] >= 0.6
    with pytest.raises(RuntimeError, match="running already"):
        keeper.act("start")
    keeper.stop()


def test_an_outage_still_open_at_the_end_is_reported(ctrl):
    keeper = ControllerKeeper(ctrl, _Record(), dilation=4000, say=lambda s: None)
    keeper.start_watching(time.time())
    keeper.act("stop")
    [outage] = keeper.stop()
    assert outage["resynced"] is False and "outage_s" not in outage
    assert json.loads(json.dumps(outage)) == outage
