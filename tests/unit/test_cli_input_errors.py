"""`fabric-emu run` and `show` reject bad input with exit 2, one line per problem, creating nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BAD = {
    "yaml-syntax": ("name: e\ntopology: topo.yaml\nworkload: [\n", "exp.yaml: line"),
    "unknown-key": ("name: e\ntopology: topo.yaml\nworkload: {type: allreduce, size: 1MB}\nextra: 1\n",
                    "exp.yaml: extra: unknown key"),
    "wrong-type": ("name: e\ntopology: topo.yaml\nworkload: {type: allreduce, size: 1MB, iterations: many}\n",
                   "exp.yaml: workload.iterations:"),
    "impossible": ("name: e\ntopology: topo.yaml\nworkload: {type: allreduce, size: 1MB, qps_per_peer: 0}\n",
                   "exp.yaml: workload.qps_per_peer:"),
    "missing-topology-file": ("name: e\ntopology: gone.yaml\nworkload: {type: allreduce, size: 1MB}\n",
                              "exp.yaml: topology: file not found"),
    "unknown-host": ("name: e\ntopology: topo.yaml\nworkload: {type: allreduce, size: 1MB, ranks: [h1, h9]}\n",
                     "exp.yaml: workload.ranks: unknown host 'h9'"),
    "one-machine": ("name: e\ntopology: topo.yaml\nworkload: {type: allreduce, size: 1MB}\n"
                    "machines: [{name: a, address: 192.0.2.1}]\n", "exp.yaml: machines: one machine is no partition"),
    "machine-address": ("name: e\ntopology: topo.yaml\nworkload: {type: allreduce, size: 1MB}\nmachines: "
                        "[{name: a, address: 192.0.2.1}, {name: b, address: 'b;reboot'}]\n",
                        "exp.yaml: machines.1.address: 'b;reboot' is not an IPv4"),
    "more-machines-than-units": ("name: e\ntopology: topo.yaml\nworkload: {type: allreduce, size: 1MB}\nmachines: ["
                                 + ", ".join(f"{{name: m{i}, address: 192.0.2.{i}}}" for i in range(1, 6)) + "]\n",
                                 "exp.yaml: machines: 5 machines need at least 5 fabric units; this fabric has 4"),
    "machines-with-pfcwd": ("name: e\ntopology: topo.yaml\nworkload: {type: allreduce, size: 1MB}\nmachines: "
                            "[{name: a, address: 192.0.2.1}, {name: b, address: b.lab.example}]\n"
                            "pfcwd: {enabled: true}\n",
                            "exp.yaml: pfcwd: the PFC watchdog cannot run over several machines yet"),
    "machines-ssh-address": ("name: e\ntopology: topo.yaml\nworkload: {type: allreduce, size: 1MB}\nmachines: "
                             "[{name: a, address: 192.0.2.1}, {name: b, address: 192.0.2.2, ssh_address: 'x y'}]\n",
                             "exp.yaml: machines.1.ssh_address: 'x y' is not an IPv4"),
}


def fabric_emu(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "FABRIC_EMU_STATE_DIR": str(cwd / "state"), "COLUMNS": "80"}
    return subprocess.run([sys.executable, "-m", "fabric_emu", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_exits_2_with_one_line_and_creates_nothing(spec_dir: Path, case: str):
    text, expected = BAD[case]
    (spec_dir / "exp.yaml").write_text(text)
    before = set(os.listdir(spec_dir))
    r = fabric_emu(["run", "exp.yaml", "--out", "results"], spec_dir)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ") and expected in lines[0], lines[0]
    assert "Traceback" not in r.stderr
    assert set(os.listdir(spec_dir)) == before  # no results/, no state/


def test_missing_experiment_file(tmp_path: Path):
    r = fabric_emu(["run", "nope.yaml"], tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip() == "error: nope.yaml: file not found"
    assert os.listdir(tmp_path) == []


def test_show_prints_the_plan_without_root(spec_dir: Path):
    r = fabric_emu(["show", "exp.yaml", "--set", "topology.spines=3"], spec_dir)
    assert r.returncode == 0, r.stderr
    assert "spine3" in r.stdout and "h8" in r.stdout and "10.0.4.2" in r.stdout


def test_show_accepts_a_topology_file():
    repo = Path(__file__).resolve().parents[2]
    r = fabric_emu(["show", str(repo / "topologies" / "ls-2x4x2.yaml")], repo)
    assert r.returncode == 0, r.stderr
    assert "leaf4" in r.stdout and "oversubscription 1:1" in r.stdout
