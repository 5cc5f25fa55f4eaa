"""Helpers for integration tests that run the real `fabric-emu` command."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

from pyroute2 import IPRoute

from fabric_emu.fabric.build import switch_interfaces
from fabric_emu.topo.plan import FabricPlan
from fabric_emu.ports.datapath import PIN_ROOT
from fabric_emu.state.records import OVS_OWNER_KEY, RUNS_DIR

REPO = Path(__file__).resolve().parents[2]


def fabric_emu(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fabric_emu", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def run_shipped(tmp_path_factory, name: str, *sets: str) -> tuple[Path, subprocess.CompletedProcess]:
    """`fabric-emu run experiments/<name>.yaml --set ...` into a fresh folder: (run dir, result)."""
    out = tmp_path_factory.mktemp("results")
    args = [a for s in sets for a in ("--set", s)]
    r = fabric_emu("run", str(REPO / "experiments" / f"{name}.yaml"), "--out", str(out), *args)
    return only_run_dir(out, name), r


def only_run_dir(out: Path, experiment: str) -> Path:
    (run_dir,) = list((out / experiment).iterdir())
    return run_dir


def read_csv(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def late_pauses_said(summary: dict) -> list[str]:
    """The run's warnings of frames that came in past the headroom, which it must give exactly
    when the port programs counted such frames. A pause put into effect late under this
    kernel's load (issue 20, part 4: the PFC daemon's wake-up on a busy 2-core machine, once
    6 ms) may keep frames past the headroom; that is the machine's doing, and it must say so."""
    late = [w for w in summary["fidelity"]["warnings"] if "beyond xoff + headroom" in w]
    assert bool(late) == (summary["switch"]["headroom_overruns"] > 0), (late, summary["switch"], summary.get("pfc_reaction"))
    return late


def trusted_but_for_late_pauses(summary: dict) -> bool:
    """Trusted, or untrusted only for frames past the headroom (late_pauses_said)."""
    late = late_pauses_said(summary)
    return summary["fidelity"]["trusted"] or bool(late) and len(late) == len(summary["fidelity"]["warnings"])


def our_bridges() -> list[str]:
    out = subprocess.run(["ovs-vsctl", "--format=json", "--columns=name,external_ids", "list", "bridge"],
                         capture_output=True, text=True, check=True).stdout
    return [name for name, (_, ids) in json.loads(out)["data"]
            if any(k == OVS_OWNER_KEY for k, _ in ids)]


def our_processes() -> list[str]:
    """Processes running fabric-emu's agent or controller modules (read-only scan of /proc)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (b"fabric_emu.nic" in cmd or b"fabric_emu.ports.pfcd" in cmd
                or (b"-m" in cmd and b"controller" in cmd)):
            found.append(f"{pid}: {b' '.join(cmd).decode(errors='replace')}")
    return found


def leftovers(plan: FabricPlan) -> list[str]:
    with IPRoute() as ipr:
        links = {ln.get_attr("IFLA_IFNAME") for ln in ipr.get_links()}
    left = [f"bridge {b}" for b in our_bridges()]
    left += [f"interface {i}" for i in sorted(links & set(switch_interfaces(plan)))]
    left += [f"record {p.name}" for p in RUNS_DIR.glob("*.json")] if RUNS_DIR.is_dir() else []
    left += [f"process {p}" for p in our_processes()]
    left += [f"bpf pins {p}" for p in PIN_ROOT.iterdir()] if PIN_ROOT.is_dir() else []
    return left
