"""The results folder: results/<experiment>/<UTC timestamp>/ with atomically written files."""

from __future__ import annotations

import csv
import io
import json
import platform
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata as importlib_metadata
from pathlib import Path

from ruamel.yaml import YAML

from fabric_emu.state.records import write_atomic

REPO = Path(__file__).resolve().parent.parent


def utc_stamp(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H-%M-%SZ")


def iso(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, timezone.utc).isoformat()


def make_run_dir(base: Path, experiment: str, started: float, prefix: str = "") -> Path:
    """A new, unique folder for one run (a suffix is added if two runs share a second);
    `prefix` names other kinds of folder beside the runs (a sweep's: sweep-<time>)."""
    parent = base / experiment
    parent.mkdir(parents=True, exist_ok=True)
    stamp = prefix + utc_stamp(started)
    for n in range(100):
        d = parent / (stamp if n == 0 else f"{stamp}-{n}")
        try:
            d.mkdir()
            return d
        except FileExistsError:
            continue
    raise RuntimeError(f"cannot create a results folder under {parent}")


def write_json(path: Path, data: object) -> None:
    write_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def write_yaml(path: Path, data: object) -> None:
    y = YAML()
    y.default_flow_style = False
    buf = io.StringIO()
    y.dump(data, buf)
    write_atomic(path, buf.getvalue())


def write_csv(path: Path, rows: list[dict]) -> None:
    buf = io.StringIO()
    if rows:
        w = csv.DictWriter(buf, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    write_atomic(path, buf.getvalue())


def _cmd_version(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.splitlines()[0].strip() if out else None


def _git(*args: str) -> str | None:
    try:
        r = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def _pkg_version(name: str) -> str | None:
    try:
        return importlib_metadata.version(name)
    except importlib_metadata.PackageNotFoundError:
        return None


def environment() -> dict:
    """Versions and git state that make a result reproducible."""
    try:
        from mininet.net import VERSION as mininet_version
    except ImportError:
        mininet_version = None
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(status) if status is not None else None,
        "python": sys.version.split()[0],
        "mininet": mininet_version,
        "openvswitch": _cmd_version(["ovs-vsctl", "--version"]),
        "os_ken": _pkg_version("os-ken"),
        "fabric_emu": _pkg_version("fabric-emu"),
        "kernel": platform.release(),
        "machine": {"cpus": __import__("os").cpu_count(), "platform": platform.platform()},
    }
