"""Chaos: kill -9 one part of a run at a random moment of its traffic, several times a part.

What each trial asserts is measured on the run that was hit: it ended long before its own
deadline (the traffic deadline it was given, which it must not reach), with the right status
and a summary whose error names the part and when it died; then `fabric-emu clean` finds
nothing, and nothing the run's record names is left (bridges, link ends, processes including
the host namespaces' shells, its temporary folder). The PFC daemon's trials run an incast that
keeps ports paused: a restarted daemon that left a gate closed would stall its port for good
and the run would end `incomplete` at its deadline instead of `ok`.

Kill times come from a seeded RNG (CHAOS_SEED, printed); each trial prints its kill-to-end time
and the summary's error (`pytest -s` shows them).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fabric_emu.fabric.build import conflicts
from fabric_emu.kernel.ovs_service import vswitchd_pid
from fabric_emu.run.prepare import load_checked
from fabric_emu.state.records import RUNS_DIR, RunRecord
from tests.integration.fabric_checks import REPO, fabric_emu, leftovers, read_json

pytestmark = [pytest.mark.root, pytest.mark.slow]

SEED = int(os.environ.get("CHAOS_SEED", "20"))
TRIALS = 3
QUICKSTART = REPO / "experiments" / "quickstart.yaml"
INCAST = REPO / "experiments" / "incast.yaml"
# 4 hosts on 3 switches (2 NIC engines on 2 cores) with about a minute of ring traffic: a run
# that ends within seconds of a kill ended because of it, not because it was done.
SMALL = ["--set", "topology.spines=1", "--set", "topology.leaves=2", "--set", "workload.size=200MB",
         "--set", "timeout=120s"]
INCAST_SETS = ["--set", "workload.size=6MB", "--set", "timeout=60s"]


def rng_for(part: str) -> random.Random:
    return random.Random(f"{SEED}:{part}")


def wait_for_line(proc: subprocess.Popen, text: str, timeout: float, seen: list[str]) -> None:
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        seen.append(line)
        if text in line:
            return
        assert time.monotonic() < deadline, f"no '{text}' within {timeout}s:\n{''.join(seen)}"
    pytest.fail(f"run ended before '{text}':\n{''.join(seen)}")


def the_record() -> RunRecord:
    (path,) = RUNS_DIR.glob("*.json")
    return RunRecord.load(path)


def nothing_left(plan, record: RunRecord) -> None:
    # Processes: those the run's record names (other work on this machine may run NIC engines).
    assert [x for x in leftovers(plan) if not x.startswith("process ")] == []
    assert conflicts(plan) == []  # no bridge, nor device named as one (a userspace bridge's tap)
    assert not [p for p in record.processes if p.alive()], "processes of the run still alive"
    assert not [p for p in record.paths if Path(p).exists()], "temporary paths of the run left"
    r = fabric_emu("clean")
    assert r.returncode == 0 and "nothing to clean" in r.stdout, r.stdout + r.stderr
    assert subprocess.run(["ovs-vsctl", "--timeout=5", "show"], capture_output=True).returncode == 0, \
        "OVS is not running after the trial"


def kill_during_traffic(tmp_path: Path, experiment: Path, sets: list[str], target, delay_s: float):
    """Start a run, kill -9 what target(record) names delay_s after its traffic started; returns
    (run dir, exit code, output, kill-to-end seconds, the killed pid, the record)."""
    out = tmp_path / "out"
    run = subprocess.Popen([sys.executable, "-m", "fabric_emu", "run", str(experiment), "--out", str(out), *sets],
                           cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env={**os.environ, "COLUMNS": "200"})
    seen: list[str] = []
    try:
        wait_for_line(run, "traffic:", 180, seen)
        time.sleep(delay_s)
        record = the_record()
        pid = target(record)
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        rest = run.communicate(timeout=300)[0]
        took = time.monotonic() - killed
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    (run_dir,) = list(out.iterdir())[0].iterdir()
    return run_dir, run.returncode, "".join(seen) + rest, took, pid, record


def engine_pid(rng: random.Random):
    def pick(record: RunRecord) -> int:
        engines = sorted((p for p in record.processes if p.role.startswith("nic engine")), key=lambda p: p.role)
        return rng.choice(engines).pid
    return pick


def role_pid(role: str):
    return lambda record: next(p.pid for p in record.processes if p.role == role)


def ovs_pid(_record: RunRecord) -> int:
    pid = vswitchd_pid()
    assert pid is not None
    return pid


def deadline_s(run_dir: Path) -> float:
    import yaml
    return float(yaml.safe_load((run_dir / "experiment.yaml").read_text())["timeout"])


def report(part: str, trial: int, delay: float, took: float, summary: dict, after: str = "'traffic:'") -> None:
    print(f"\nchaos {part} trial {trial} (CHAOS_SEED={SEED}): killed {delay:.2f} s after {after}; "
          f"run ended {took:.2f} s later, status {summary['status']}; error: {summary.get('error')}; "
          f"restarts: {summary.get('restarts')}", flush=True)


@pytest.fixture(scope="module")
def small_plan():
    return load_checked(QUICKSTART, [s for s in SMALL if s != "--set"])[1]


@pytest.mark.parametrize("trial", range(TRIALS))
def test_nic_engine_killed_fails_the_run_promptly(tmp_path, small_plan, trial):
    rng = rng_for(f"nic{trial}")
    delay = rng.uniform(0.5, 4.0)
    run_dir, code, out, took, pid, record = kill_during_traffic(tmp_path, QUICKSTART, SMALL, engine_pid(rng), delay)
    s = read_json(run_dir / "summary.json")
    report("NIC engine", trial, delay, took, s)
    assert code == 1, out
    assert s["status"] == "failed"
    assert "NIC engine" in s["error"] and "was killed by signal 9 (SIGKILL)" in s["error"], s["error"]
    assert "after traffic started" in s["error"]
    assert took < deadline_s(run_dir) / 4, f"{took:.1f} s from the kill to the end"
    assert "deadline" not in s  # not ended by its deadline
    assert not any("raise the dilation" in w and "lost" in w for w in s["fidelity"]["warnings"]), s["fidelity"]
    assert s["transport"]["bytes_received"] > 0  # what was measured before the kill is kept
    assert (run_dir / "ports.csv").exists() and (run_dir / "flows.csv").exists()
    nothing_left(small_plan, record)


@pytest.mark.parametrize("trial", range(TRIALS))
def test_ovs_killed_fails_the_run_and_ovs_comes_back(tmp_path, small_plan, trial):
    delay = rng_for(f"ovs{trial}").uniform(0.5, 4.0)
    run_dir, code, out, took, pid, record = kill_during_traffic(tmp_path, QUICKSTART, SMALL, ovs_pid, delay)
    s = read_json(run_dir / "summary.json")
    report("ovs-vswitchd", trial, delay, took, s)
    assert code == 1, out
    assert s["status"] == "failed"
    assert f"Open vSwitch (ovs-vswitchd, pid {pid}) stopped" in s["error"], s["error"]
    assert took < deadline_s(run_dir) / 4, f"{took:.1f} s from the kill to the end"
    assert "deadline" not in s
    assert not any("raise the dilation" in w and "lost" in w for w in s["fidelity"]["warnings"]), s["fidelity"]
    assert vswitchd_pid() not in (None, pid)  # a new one runs
    nothing_left(small_plan, record)


@pytest.fixture(scope="module")
def incast_plan():
    return load_checked(INCAST, [s for s in INCAST_SETS if s != "--set"])[1]


@pytest.mark.parametrize("trial", range(TRIALS))
def test_pfc_daemon_killed_is_restarted_and_the_run_completes(tmp_path, incast_plan, trial):
    delay = rng_for(f"pfcd{trial}").uniform(0.3, 2.5)
    run_dir, code, out, took, pid, record = kill_during_traffic(tmp_path, INCAST, INCAST_SETS,
                                                                role_pid("pfc-daemon"), delay)
    s = read_json(run_dir / "summary.json")
    report("PFC daemon", trial, delay, took, s)
    (restart,) = s["restarts"]
    assert restart["component"] == "the PFC daemon" and restart["how"] == "was killed by signal 9 (SIGKILL)"
    # Every gate reopened (or none was closed), every byte delivered: nothing stayed paused.
    assert s["status"] == "ok", out
    assert code == 0
    assert s["transport"]["bytes_received"] == 7 * 6_000_000
    assert s["switch"]["pause_tx"] > 0  # the incast did pause
    assert any(w.startswith("the PFC daemon was killed by signal 9") for w in s["fidelity"]["warnings"])
    print(f"  gates the dead daemon held closed, reopened: {restart['gates_reopened']}")
    nothing_left(incast_plan, record)


def _stop_the_exporter(servers: list, delay_s: float, stopped: list[float]) -> None:
    time.sleep(delay_s)
    (server,) = servers
    server._server.shutdown()  # its serving thread ends, as it would on a crash
    stopped.append(time.monotonic())


@pytest.mark.parametrize("trial", range(TRIALS))
def test_exporter_stopped_fails_the_run(tmp_path, small_plan, trial, monkeypatch):
    """The exporter is a thread of the run's own process (kill -9 of it is kill -9 of the run:
    test_kill9_clean); here its server is stopped under it from inside an API run."""
    from fabric_emu.api import Experiment, RunError
    from fabric_emu.live.exporter import MetricsServer

    servers: list[MetricsServer] = []
    start = MetricsServer.__init__

    def keep(self, *args, **kwargs) -> None:  # the run's exporter, for the thread that stops it
        start(self, *args, **kwargs)
        servers.append(self)

    monkeypatch.setattr(MetricsServer, "__init__", keep)
    delay = rng_for(f"exporter{trial}").uniform(2.0, 5.0)  # from the traffic phase's start (NICs ~1.5 s)
    stopped: list[float] = []

    def progress(ev) -> None:
        if ev.phase == "traffic" and ev.text == "starting":
            threading.Thread(target=_stop_the_exporter, args=(servers, delay, stopped), daemon=True).start()

    exp = Experiment.from_file(QUICKSTART, sets=[s for s in SMALL if s != "--set"])
    with pytest.raises(RunError) as e:
        exp.run(tmp_path / "out", progress=progress, quiet=True, metrics_port=0)
    took = time.monotonic() - stopped[0]
    run_dir = e.value.results.path
    s = read_json(Path(run_dir) / "summary.json")
    report("exporter", trial, delay, took, s, after="the traffic phase began")
    assert s["status"] == "failed"
    assert "the Prometheus exporter stopped serving" in s["error"], s["error"]
    assert took < deadline_s(Path(run_dir)) / 4
    assert [x for x in leftovers(small_plan) if not x.startswith("process ")] == []
    assert fabric_emu("clean").stdout.strip() == "nothing to clean"
