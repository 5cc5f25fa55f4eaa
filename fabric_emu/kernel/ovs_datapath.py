"""Which Open vSwitch datapath the switches use: the kernel's (`openvswitch.ko`, a few us per
forwarded packet, spent in softirq) or the userspace one (ovs-vswitchd's main thread, ~60-80 us
per packet here), and the kernel plumbing each one needs before its first bridge.

`auto` takes the kernel datapath when the module is loaded or loads, else the userspace one;
`kernel` insists (DatapathUnavailable when the module cannot load: the spec asked for what this
machine lacks). The module probe is a parameter, so the choice is testable without root.

Two traps, measured in a VM with the module (docs/performance.md):
- the userspace datapath opens a tap device per bridge: it needs the `tun` module;
- an ovs-vswitchd that started before the kernel datapath existed gives the first kernel bridge
  zero upcall handler threads, and every upcall is lost (`ovs-dpctl show`: lost). Creating the
  datapath first (`ovs-dpctl add-dp system@ovs-system`) avoided it in 5 of 5 runs.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

DATAPATHS = ("auto", "kernel", "userspace")
SYSTEM_DP = "system@ovs-system"  # the one kernel datapath all of OVS's kernel bridges share
MODULE_DIR = Path("/sys/module/openvswitch")
MININET_DATAPATH = {"kernel": "kernel", "userspace": "user"}  # OVSSwitch(datapath=...)
DATAPATH_TYPE = {"kernel": "system", "userspace": "netdev"}  # OVS's Bridge.datapath_type

Probe = Callable[[], tuple[bool, str]]  # () -> (module usable, why)


class DatapathUnavailable(Exception):
    """`datapath: kernel` on a machine whose kernel cannot load openvswitch.ko."""


@dataclass(frozen=True)
class DatapathChoice:
    datapath: str  # "kernel" or "userspace"
    reason: str
    asked: str = "auto"

    def to_dict(self) -> dict:
        return {"datapath": self.datapath, "asked": self.asked, "reason": self.reason}


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def probe_module(module_dir: Path = MODULE_DIR, is_root: bool | None = None) -> tuple[bool, str]:
    """(whether openvswitch.ko is usable, why). As root, loads it if it is not loaded yet;
    otherwise only asks modprobe whether it could (`fabric-emu show` without sudo)."""
    if module_dir.exists():
        return True, "openvswitch module loaded"
    root = os.geteuid() == 0 if is_root is None else is_root
    cmd = ["modprobe", "openvswitch"] if root else ["modprobe", "--dry-run", "openvswitch"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        return False, "modprobe openvswitch: modprobe not found"
    except subprocess.TimeoutExpired:
        return False, "modprobe openvswitch: timed out"
    if r.returncode != 0:
        said = _last_line(r.stderr).removeprefix("modprobe: ")
        return False, f"modprobe openvswitch: {said or f'exit status {r.returncode}'}"
    if root:
        return True, "openvswitch module loaded (modprobe openvswitch)"
    return True, "openvswitch module available (a run as root loads it)"


def choose(asked: str, probe: Probe = probe_module) -> DatapathChoice:
    """The datapath for `datapath: asked`; DatapathUnavailable when `kernel` cannot be had."""
    if asked not in DATAPATHS:
        raise ValueError(f"datapath {asked!r} (allowed: {', '.join(DATAPATHS)})")
    if asked == "userspace":
        return DatapathChoice("userspace", "datapath: userspace asked for", asked)
    usable, why = probe()
    if usable:
        return DatapathChoice("kernel", why if asked == "auto" else f"datapath: kernel asked for; {why}", asked)
    if asked == "kernel":
        raise DatapathUnavailable(why)
    return DatapathChoice("userspace", f"{why}: the userspace datapath instead", asked)


def datapath_of(extra: dict) -> str:
    """The datapath a plan's extra records (a plan nobody resolved one for: userspace, as before)."""
    return (extra.get("datapath") or {}).get("datapath", "userspace")


def datapath_fields(extra: dict) -> dict:
    """summary.json's and metadata.json's `datapath` and `datapath_reason` (nothing for a plan
    that none was chosen for)."""
    dp = extra.get("datapath")
    return {"datapath": dp["datapath"], "datapath_reason": dp["reason"]} if dp else {}


# --------------------------------------------------------------------------- kernel plumbing


def parse_dpctl_show(text: str) -> dict[str, dict[str, int]]:
    """`ovs-dpctl show`: {datapath name: {"hit", "missed", "lost", "flows"}} (lookups of its flow
    cache: missed ones went up to ovs-vswitchd, lost ones never came back)."""
    out: dict[str, dict[str, int]] = {}
    current: dict[str, int] | None = None
    for line in text.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith(":"):
            current = out.setdefault(line.rstrip()[:-1], {"hit": 0, "missed": 0, "lost": 0, "flows": 0})
        elif current is not None:
            if m := re.match(r"\s*lookups:\s*hit:(\d+)\s+missed:(\d+)\s+lost:(\d+)", line):
                current.update(hit=int(m[1]), missed=int(m[2]), lost=int(m[3]))
            elif m := re.match(r"\s*flows:\s*(\d+)", line):
                current["flows"] = int(m[1])
    return out


def parse_dpif_show(text: str) -> dict[str, set[str]]:
    """`ovs-appctl dpif/show`: {datapath: its bridges} (e.g. system@ovs-system: {leaf1, spine1})."""
    out: dict[str, set[str]] = {}
    current: set[str] | None = None
    for line in text.splitlines():
        if m := re.match(r"^(\S+@\S+):", line):
            current = out.setdefault(m[1], set())
        elif current is not None and (m := re.match(r"^  (\S+):\s*$", line)):
            current.add(m[1])
    return out


def bridges_off_the_kernel_datapath(bridges: list[str]) -> list[str]:
    """Those of these bridges ovs-vswitchd did not put on the kernel datapath (it could not open
    it: e.g. it started before the module was loaded, and keeps that failure until restarted)."""
    r = subprocess.run(["ovs-appctl", "dpif/show"], capture_output=True, text=True, timeout=10)
    on = parse_dpif_show(r.stdout).get(SYSTEM_DP, set()) if r.returncode == 0 else set()
    return [b for b in bridges if b not in on]


def lost_upcalls_hint() -> str:
    """A sentence for a fabric that does not connect, when the kernel datapath lost upcalls."""
    lost = (dpctl_stats() or {}).get("lost", 0)
    if not lost:
        return ""
    return (f" (OVS's kernel datapath lost {lost} upcalls: ovs-vswitchd may have no handler threads;"
            " restart it with scripts/setup.sh now that the datapath exists)")


def dpctl_stats(dp: str = SYSTEM_DP) -> dict[str, int] | None:
    """The kernel datapath's lookup counters now (None: no such datapath, or no ovs-dpctl)."""
    try:
        r = subprocess.run(["ovs-dpctl", "show", dp], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_dpctl_show(r.stdout).get(dp) if r.returncode == 0 else None


def ensure_kernel_datapath() -> bool:
    """Create OVS's kernel datapath unless it exists (True: it was created now). Never removed
    by fabric-emu: every kernel bridge of this OVS shares it, and OVS removes it itself when
    its last kernel bridge goes."""
    r = subprocess.run(["ovs-dpctl", "show"], capture_output=True, text=True, timeout=10)
    if r.returncode == 0 and SYSTEM_DP in parse_dpctl_show(r.stdout):
        return False
    r = subprocess.run(["ovs-dpctl", "add-dp", SYSTEM_DP], capture_output=True, text=True, timeout=30)
    if r.returncode != 0 and "exists" not in r.stderr:
        raise RuntimeError(f"ovs-dpctl add-dp {SYSTEM_DP}: {_last_line(r.stderr) or r.returncode}")
    return r.returncode == 0


def prepare(datapath: str) -> None:
    """What a datapath needs before its first bridge: the kernel's, created up front (see the
    module doc); the userspace one, the tun module (best effort: it may be built in)."""
    if datapath == "kernel":
        ensure_kernel_datapath()
    elif not Path("/sys/module/tun").exists():  # loaded or built in: nothing to do
        try:
            subprocess.run(["modprobe", "tun"], capture_output=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            pass
