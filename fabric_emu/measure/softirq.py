"""Where OVS's kernel datapath spends its CPU: per-CPU softirq (and system) time from /proc/stat.

The kernel datapath has no forwarding thread to watch. A frame a veth delivers is received in
the NET_RX softirq of some CPU (the one RPS steers its flow to, fabric_emu.kernel.rps); OVS's
lookup and the transmit into the next veth (its qdisc, the port program) run there too, and so
does the next hop's receive. So its cost shows as softirq time, per CPU: a CPU that spends
nearly all its time in softirq is the kernel datapath's bottleneck, however idle the others.
Some of it is charged as system time instead (a sender's syscall that runs the softirq on its
way out), so both are kept. /proc/stat counts in USER_HZ ticks (CLK_TCK): 10 ms here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

CLK_TCK = os.sysconf("SC_CLK_TCK")
# /proc/stat's columns: user nice system idle iowait irq softirq steal (guest time is in user)
SYSTEM, IDLE, IOWAIT, IRQ, SOFTIRQ = 2, 3, 4, 5, 6

CpuTimes = dict[str, list[int]]  # "cpu0" -> its first 8 columns, in ticks


def parse_proc_stat(text: str) -> CpuTimes:
    """Every CPU's line of /proc/stat (not the first, summed "cpu" line)."""
    out: CpuTimes = {}
    for line in text.splitlines():
        if line.startswith("cpu") and line[3:4].isdigit():
            name, *cols = line.split()
            out[name] = [int(c) for c in cols[:8]] + [0] * (8 - len(cols[:8]))
    return out


def read_proc_stat(path: str = "/proc/stat") -> CpuTimes:
    with open(path) as f:
        return parse_proc_stat(f.read())


@dataclass(frozen=True)
class CpuShare:
    """Fractions of one CPU's time between two snapshots."""

    busy: float  # anything but idle and iowait
    system: float
    softirq: float  # irq included: hard interrupts of a veth are few, but they are the datapath's


def shares(before: CpuTimes, after: CpuTimes) -> dict[str, CpuShare]:
    """Each CPU's busy, system and softirq fractions between two snapshots (CPUs that did not
    tick in between, or went offline, are left out)."""
    out = {}
    for cpu, b in after.items():
        a = before.get(cpu)
        if a is None:
            continue
        d = [max(0, x - y) for x, y in zip(b, a)]
        total = sum(d)
        if total <= 0:
            continue
        idle = d[IDLE] + d[IOWAIT]
        out[cpu] = CpuShare((total - idle) / total, d[SYSTEM] / total, (d[SOFTIRQ] + d[IRQ]) / total)
    return out


def cpu_seconds(before: CpuTimes, after: CpuTimes, tick_hz: int = CLK_TCK) -> dict[str, float]:
    """CPU seconds of softirq (with irq) and of system time, summed over every CPU."""
    soft = sys_ = 0
    for cpu, b in after.items():
        a = before.get(cpu)
        if a is not None:
            soft += max(0, b[SOFTIRQ] - a[SOFTIRQ]) + max(0, b[IRQ] - a[IRQ])
            sys_ += max(0, b[SYSTEM] - a[SYSTEM])
    return {"softirq": soft / tick_hz, "system": sys_ / tick_hz}
