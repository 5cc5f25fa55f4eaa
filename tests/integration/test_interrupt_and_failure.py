"""Ctrl-C, a timeout and a name clash: exit 1, results say so, and nothing is left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from fabric_emu.run.prepare import load_checked
from tests.integration.fabric_checks import REPO, fabric_emu, leftovers, only_run_dir, read_json

pytestmark = [pytest.mark.root, pytest.mark.slow]

QUICKSTART = REPO / "experiments" / "quickstart.yaml"
LONG = ["--set", "workload.size=400MB"]


@pytest.fixture(scope="module")
def plan():
    return load_checked(QUICKSTART, [])[1]


def test_ctrl_c_tears_down_and_marks_incomplete(tmp_path, plan):
    run = subprocess.Popen([sys.executable, "-m", "fabric_emu", "run", str(QUICKSTART),
                            "--out", str(tmp_path), *LONG], cwd=REPO, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": "200"})
    for line in run.stdout:
        if "traffic:" in line:
            break
    time.sleep(1.5)
    run.send_signal(signal.SIGINT)
    out = run.communicate(timeout=60)[0]
    assert run.returncode == 1, out
    s = read_json(only_run_dir(tmp_path, "quickstart") / "summary.json")
    assert s["status"] == "incomplete" and "interrupted" in s["error"]
    assert s["transport"]["bytes_received"] > 0  # what was measured before Ctrl-C is kept
    assert leftovers(plan) == []


def test_timeout_is_a_run_time_failure(tmp_path, plan):
    r = fabric_emu("run", str(QUICKSTART), "--out", str(tmp_path), *LONG, "--set", "timeout=2s")
    assert r.returncode == 1, r.stdout
    s = read_json(only_run_dir(tmp_path, "quickstart") / "summary.json")
    assert s["status"] == "incomplete"
    assert leftovers(plan) == []


def test_foreign_bridge_with_a_fabric_name_is_left_alone(tmp_path, plan):
    subprocess.run(["ovs-vsctl", "add-br", "spine2", "--", "set", "bridge", "spine2",
                    "datapath_type=netdev"], check=True)
    try:
        r = fabric_emu("run", str(QUICKSTART), "--out", str(tmp_path))
        assert r.returncode == 1
        assert "spine2" in r.stderr and "not fabric-emu's" in r.stderr
        assert not (tmp_path / "quickstart").exists()  # refused before creating anything
        bridges = subprocess.run(["ovs-vsctl", "list-br"], capture_output=True, text=True).stdout
        assert "spine2" in bridges.split()  # and the user's bridge is still there
        assert fabric_emu("clean").returncode == 0
        bridges = subprocess.run(["ovs-vsctl", "list-br"], capture_output=True, text=True).stdout
        assert "spine2" in bridges.split()  # clean does not touch it either
    finally:
        subprocess.run(["ovs-vsctl", "--if-exists", "del-br", "spine2"], check=True)
