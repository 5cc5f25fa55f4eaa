"""Open vSwitch's daemons as a run meets them: is ovs-vswitchd up, and bring it back when not.

scripts/setup.sh starts OVS once per boot; a run that finds it gone (a crash, a kill -9, a run
whose fabric it was serving when it died) starts it the same way rather than fail on the first
`ovs-vsctl`: with ovs-ctl, after the kernel datapath where the kernel has the module (the order
setup.sh explains).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from fabric_emu.kernel.ovs_datapath import ensure_kernel_datapath

OVS_CTL = "/usr/share/openvswitch/scripts/ovs-ctl"
PIDFILES = ("/var/run/openvswitch/ovs-vswitchd.pid", "/run/openvswitch/ovs-vswitchd.pid")


def vswitchd_pid(pidfiles: tuple[str, ...] = PIDFILES) -> int | None:
    """The running ovs-vswitchd's pid from its pidfile (None if none runs)."""
    for path in pidfiles:
        try:
            pid = int(Path(path).read_text().strip())
            if Path(f"/proc/{pid}/comm").read_text().strip() == "ovs-vswitchd":
                return pid
        except (OSError, ValueError):
            continue  # no pidfile, or a stale one
    return None


def _quiet(cmd: list[str], timeout: float) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None


def responding() -> bool:
    """Both daemons answer (the database and the switch daemon), as setup.sh checks."""
    return all((r := _quiet(cmd, 10)) is not None and r.returncode == 0
               for cmd in (["ovs-vsctl", "--timeout=2", "show"], ["ovs-appctl", "--timeout=2", "version"]))


def start() -> bool:
    """Start whichever OVS daemon is not running (ovs-ctl leaves a running one alone); True
    once both answer."""
    loaded = Path("/sys/module/openvswitch").exists()
    if not loaded:
        r = _quiet(["modprobe", "openvswitch"], 30)
        loaded = r is not None and r.returncode == 0
    if loaded:  # the kernel datapath first, else its first bridge gets no handler threads
        try:
            ensure_kernel_datapath()
        except RuntimeError:
            pass  # the userspace datapath still works; a kernel-datapath run says why it cannot
    _quiet(["modprobe", "tun"], 30)
    _quiet([OVS_CTL, "start", "--system-id=random"], 120)
    return responding()
