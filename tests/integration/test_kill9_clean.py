"""After kill -9 of a run in progress, `fabric-emu clean` removes all of it; the next run works."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from fabric_emu.run.prepare import load_checked
from fabric_emu.state.records import RUNS_DIR, RunRecord
from tests.integration.fabric_checks import REPO, fabric_emu, leftovers, our_bridges, read_json

pytestmark = [pytest.mark.root, pytest.mark.slow]

LONG = ["--set", "workload.size=400MB", "--set", "workload.iterations=5"]  # minutes of traffic
QUICKSTART = REPO / "experiments" / "quickstart.yaml"


def wait_for_line(proc: subprocess.Popen, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        if text in line:
            return
        assert time.monotonic() < deadline, f"no '{text}' within {timeout}s"
    pytest.fail(f"run ended before '{text}'")


def test_clean_after_kill_9(tmp_path):
    _, plan, _ = load_checked(QUICKSTART, [])
    assert leftovers(plan) == [], "machine not clean before the test"
    run = subprocess.Popen([sys.executable, "-m", "fabric_emu", "run", str(QUICKSTART),
                            "--out", str(tmp_path / "out"), *LONG],
                           cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env={**os.environ, "COLUMNS": "200"})
    try:
        wait_for_line(run, "traffic:", timeout=120)
        time.sleep(1.0)  # the NICs are sending
        (record_path,) = RUNS_DIR.glob("*.json")
        record = RunRecord.load(record_path)
        run.send_signal(signal.SIGKILL)
        run.wait()
    finally:
        if run.poll() is None:
            run.kill()

    # The run is gone but what it made is not: bridges, fabric links, controller and NIC engines.
    assert our_bridges()
    alive = [p for p in record.processes if p.alive()]
    assert any(p.role == "controller" for p in alive)
    assert any(p.role.startswith("nic engine") for p in alive)

    (run_dir,) = list((tmp_path / "out" / "quickstart").iterdir())
    assert read_json(run_dir / "summary.json")["status"] == "incomplete"  # says it did not finish

    r = fabric_emu("clean")
    assert r.returncode == 0, r.stderr
    assert "removed bridge spine1" in r.stdout
    assert leftovers(plan) == []
    assert not any(p.alive() for p in record.processes)

    again = fabric_emu("clean")
    assert again.returncode == 0 and "nothing to clean" in again.stdout

    ok = fabric_emu("run", str(QUICKSTART), "--out", str(tmp_path / "again"),
                    "--set", "workload.size=2MB", "--set", "workload.iterations=1")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    (run_dir,) = list((tmp_path / "again" / "quickstart").iterdir())
    assert read_json(run_dir / "summary.json")["status"] == "ok"
    assert leftovers(plan) == []
