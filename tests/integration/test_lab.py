"""`fabric-emu lab` driven through a real terminal (pexpect), as a student types it: Mininet's
commands and ours, bad input, and every way out tearing the fabric down."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pexpect
import pytest

from fabric_emu.run.prepare import load_checked
from fabric_emu.kernel import rps
from fabric_emu.ports.datapath import PortMaps
from fabric_emu.state.records import RUNS_DIR, RunRecord, live_records
from tests.integration.fabric_checks import REPO, fabric_emu, leftovers, our_bridges, read_json

pytestmark = [pytest.mark.root, pytest.mark.slow]

QUICKSTART = REPO / "experiments" / "quickstart.yaml"
PROMPT = "lab> "
UP_TIMEOUT_S = 120


def start_lab(out) -> pexpect.spawn:
    lab = pexpect.spawn(sys.executable, ["-m", "fabric_emu", "lab", str(QUICKSTART), "--out", str(out)],
                        cwd=str(REPO), env={**os.environ, "PYTHONPATH": str(REPO)},
                        encoding="utf-8", dimensions=(50, 200), timeout=60)
    lab.expect_exact("lab up:", timeout=UP_TIMEOUT_S)
    lab.expect_exact(PROMPT)
    return lab


def type_line(lab: pexpect.spawn, line: str, expect: str, timeout: float = 60) -> str:
    """Send a line; wait for `expect` and the next prompt; what was printed in between."""
    lab.sendline(line)
    lab.expect_exact(expect, timeout=timeout)
    before = lab.before + lab.after
    lab.expect_exact(PROMPT, timeout=timeout)
    return before + lab.before


@pytest.fixture
def plan():
    _, plan, _ = load_checked(QUICKSTART, [])
    assert leftovers(plan) == [], "machine not clean before the test"
    return plan


def test_a_scripted_session_pings_runs_turns_knobs_fails_a_link_and_quits(plan, tmp_path):
    lab = start_lab(tmp_path / "out")
    try:
        type_line(lab, "h1 ping -c1 h2", "1 received")
        help_text = type_line(lab, "help", "`help mininet`")
        for cmd in ("run [WORKLOAD]", "lb [ecmp|dlb|spray]", "ecn on|off", "pfc on|off", "cc dcqcn|none",
                    "dcqcn KEY=VALUE", "link LINK down|up", "ports [SWITCH]", "queues", "flows", "save [NAME]"):
            assert cmd in help_text, cmd
        # Ctrl-C stops the command running, not the lab.
        lab.sendline("h1 ping h2")
        lab.expect_exact("bytes from", timeout=10)
        lab.sendintr()
        lab.expect_exact(PROMPT, timeout=10)
        type_line(lab, "run allreduce 2MB as ecmp", "ecmp: ok", timeout=180)
        type_line(lab, "lb spray", "load balancing is now spray")
        type_line(lab, "cc none", "congestion control none")
        type_line(lab, "dcqcn preset=paper", "DCQCN preset paper")
        type_line(lab, "ecn off", "ECN off at every switch port")
        type_line(lab, "pfc off", "PFC off at every switch port")
        type_line(lab, "link leaf1-spine2 down", "link leaf1-spine2 down")
        ports = type_line(lab, "ports leaf1", "leaf1-eth4")
        assert "down" in ports.split("leaf1-eth4")[1].splitlines()[0]  # its link to spine2
        type_line(lab, "run allreduce 2MB as spray", "spray: ok", timeout=180)
        flows = type_line(lab, "flows", "queue pairs of the last run")
        assert "goodput" in flows and "h8" in flows
        type_line(lab, "knobs", "links down")
        type_line(lab, "expect spray.load_balancing == 'spray' and ecmp.load_balancing == 'ecmp'", "ok:")
        type_line(lab, "expect spray.congestion_control == 'none' and spray.switch.ecn_marked == 0", "ok:")
        # Bad input: one line each, no traceback, the lab stays up.
        for line, msg in (("bogus", "error: unknown command 'bogus'"),
                          ("run allreduce 3XB", "error:"),
                          ("lb fastest", "error: lb: got 'fastest'"),
                          ("link leaf1-leaf2 down", "error: link: leaf1-leaf2 is not a link"),
                          ("ecn maybe", "error: ecn: expected on or off"),
                          ("dcqcn rate_ai=-1Gbps", "error:"),
                          ("expect nosuch.jct_s > 0", "error: expect: no run named 'nosuch'")):
            text = type_line(lab, line, msg)
            assert "Traceback" not in text, text
        type_line(lab, "link leaf1-spine2 up", "link leaf1-spine2 up")
        type_line(lab, "save class1", "saved 2 run(s)")
        lab.sendline("quit")
        lab.expect_exact("the fabric is torn down", timeout=60)
        lab.expect(pexpect.EOF, timeout=30)
        lab.close()
        assert lab.exitstatus == 0
    finally:
        end_if_alive(lab)
    assert leftovers(plan) == []
    runs = sorted((tmp_path / "out" / "quickstart").iterdir())
    assert len(runs) == 2
    first, second = (read_json(r / "summary.json") for r in runs)
    assert (first["status"], second["status"]) == ("ok", "ok")
    assert (first["load_balancing"], second["load_balancing"]) == ("ecmp", "spray")
    assert second["congestion_control"] == "none" and (runs[1] / "ports.csv").is_file()
    saved = tmp_path / "out" / "lab" / "class1"
    assert (saved / "02-spray" / "summary.json").is_file()
    assert "lb spray" in (saved / "commands.lab").read_text()


def end_if_alive(lab: pexpect.spawn) -> None:
    """A lab still running once its test is over (the test failed): ended (SIGHUP, then SIGKILL
    if it must), and anything it left cleaned away, so the tests after it start clean."""
    if lab.isalive():
        lab.close(force=True)
        fabric_emu("clean")


def wait_for(what: Callable[[], bool], timeout_s: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not what():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_the_pfc_daemon_follows_port_state_it_heard_no_event_about(plan, tmp_path):
    """Under load the PFC daemon can miss a threshold event (its ring buffer full while it is off
    a CPU). A missed XON once paused an upstream port for good; the daemon must catch up from
    the xoff_state the port programs keep. Here the state changes with no event at all."""
    lab = start_lab(tmp_path / "out")
    try:
        (rec,) = [r for r in live_records() if r.controller_url]
        cfg = json.loads((Path(rec.paths[0]) / "pfcd.config.json").read_text())
        ids = {p["intf"]: p["id"] for p in cfg["ports"]}
        leaf, host = ids["leaf1-eth2"], ids["h2-eth0"]  # leaf1's port to h2, and h2's NIC
        maps = PortMaps(Path(cfg["pins"]))
        t = maps.table
        try:
            sent = t.get(leaf, "pause_tx", 3)
            t.set(leaf, "xoff_state", 1)  # above xoff, but the XOFF event was lost
            assert wait_for(lambda: t.get(host, "paused_since", 3) != 0), "h2 was never paused"
            # by a real PFC frame from leaf1 (h2's gate closes as it is sent, the count follows)
            assert wait_for(lambda: t.get(leaf, "pause_tx", 3) > sent), "leaf1 sent no pause frame"
            time.sleep(0.3)
            assert t.get(host, "paused_since", 3) != 0  # the pause is refreshed while it lasts
            t.set(leaf, "xoff_state", 0)  # below xon, and the XON event was lost
            assert wait_for(lambda: t.get(host, "paused_since", 3) == 0), "h2 stayed paused"
        finally:
            maps.close()
        # Receive packet steering (fabric_emu.kernel.rps) is on at both ends of h2's link, as read back
        # from the kernel: the switch end from the machine's sysfs, the host end from h2's own.
        want = int(rps.all_cpus_mask().replace(",", ""), 16)
        switch_end = Path("/sys/class/net/leaf1-eth2/queues/rx-0/rps_cpus").read_text()
        shown = type_line(lab, "h2 unshare -m sh -c 'umount -l /sys && mount -t sysfs sysfs /sys && "
                               "echo rps=$(cat /sys/class/net/h2-eth0/queues/rx-0/rps_cpus)'", "rps=")
        host_end = shown.rsplit("rps=", 1)[1].split()[0]
        assert [int(m.replace(",", ""), 16) for m in (switch_end, host_end)] == [want, want], (switch_end, shown)
        lab.sendline("quit")
        lab.expect(pexpect.EOF, timeout=60)
    finally:
        end_if_alive(lab)
    assert leftovers(plan) == []


@pytest.mark.parametrize("leave", ["Ctrl-D", "Ctrl-C", "SIGHUP", "SIGTERM"])
def test_every_way_out_tears_the_fabric_down(plan, tmp_path, leave):
    lab = start_lab(tmp_path / "out")
    try:
        if leave == "Ctrl-D":
            lab.sendeof()
        elif leave == "Ctrl-C":
            lab.sendintr()
        else:
            lab.kill(getattr(signal, leave))  # SIGHUP: the terminal went away
        lab.expect(pexpect.EOF, timeout=60)
        lab.close()
    finally:
        end_if_alive(lab)
    assert leftovers(plan) == []


def test_a_killed_lab_leaves_only_what_clean_removes(plan, tmp_path):
    lab = start_lab(tmp_path / "out")
    try:
        (record_path,) = RUNS_DIR.glob("*.json")
        record = RunRecord.load(record_path)
        lab.kill(signal.SIGKILL)
        lab.expect(pexpect.EOF, timeout=30)
        lab.close()
    finally:
        if lab.isalive():
            lab.kill(signal.SIGKILL)
    assert our_bridges()  # what it made is still there
    r = fabric_emu("clean")
    assert r.returncode == 0, r.stderr
    assert leftovers(plan) == []
    assert not any(p.alive() for p in record.processes)
    time.sleep(0.1)
