"""Remove what a run created, working only from its RunRecord.

Used at the end of every run (a safety net after Mininet's own stop) and by `fabric-emu clean`
for runs whose owner died (kill -9, power loss): processes whose pid *and* start time match,
OVS bridges tagged with the run id, root-namespace veths the record names, temporary paths.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from pyroute2 import IPRoute

from fabric_emu.state.records import OVS_OWNER_KEY, ProcessRef, RunRecord, all_records


def _stop_processes(procs: list[ProcessRef], grace_s: float = 2.0) -> list[str]:
    alive = [p for p in procs if p.alive()]
    for p in alive:
        try:
            os.kill(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(p.alive() for p in alive):
        time.sleep(0.05)
    for p in alive:
        if p.alive():
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return [f"process {p.role} (pid {p.pid})" for p in alive]


def _ovs(*args: str) -> str:
    return subprocess.run(["ovs-vsctl", "--timeout=10", *args], check=True,
                          capture_output=True, text=True).stdout


def owned_bridges(run_id: str) -> list[str]:
    """Bridges whose external_ids say this run created them."""
    try:
        out = _ovs("--format=json", "--columns=name", "find", "bridge",
                   f"external_ids:{OVS_OWNER_KEY}={run_id}")
    except (subprocess.CalledProcessError, FileNotFoundError):
        return []
    return [row[0] for row in json.loads(out)["data"]]


def _delete_bridges(run_id: str) -> list[str]:
    bridges = owned_bridges(run_id)
    if bridges:
        cmd: list[str] = []
        for br in bridges:
            cmd += ["--", "--if-exists", "del-br", br]
        _ovs(*cmd)
    return [f"bridge {b}" for b in bridges]


def _delete_interfaces(names: list[str]) -> list[str]:
    removed = []
    with IPRoute() as ipr:
        for name in names:
            idx = ipr.link_lookup(ifname=name)
            if not idx:
                continue
            link = ipr.get_links(idx[0])[0]
            info = link.get_attr("IFLA_LINKINFO")
            kind = info.get_attr("IFLA_INFO_KIND") if info else None
            # our link ends are veths, a cut link's tunnel a VXLAN device (issue 19); a name of
            # ours on anything else is not ours: left alone
            if kind not in ("veth", "vxlan"):
                continue
            try:
                ipr.link("del", index=idx[0])
                removed.append(f"interface {name}")
            except Exception:  # noqa: BLE001 - deleting one end may already remove its peer
                pass
    return removed


def clean_record(rec: RunRecord) -> list[str]:
    """Remove everything the record names; returns a line per thing removed."""
    removed = _stop_processes(list(reversed(rec.processes)))
    removed += _delete_bridges(rec.run_id)
    removed += _delete_interfaces(rec.interfaces)
    for p in rec.paths:
        path = Path(p)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(f"folder {p}")
        elif path.exists():
            path.unlink(missing_ok=True)
    rec.path.unlink(missing_ok=True)
    return removed


def clean_stale() -> tuple[list[str], list[str]]:
    """Clean every run whose owner process is gone. Returns (removed, runs still active)."""
    removed: list[str] = []
    active: list[str] = []
    for rec in all_records():
        if rec.owner_alive():
            active.append(f"{rec.run_id} (pid {rec.pid})")
            continue
        removed += clean_record(rec)
    return removed, active
