"""Receive packet steering (RPS) on every link end, so the fabric never reorders a flow.

A veth hands each frame to the receive backlog of the CPU that sent it. When two CPUs take
turns sending one flow (the egress qdisc run from the sender's CPU, from its timer on the other,
or from a pause ending), the flow's frames sit in two backlogs, and if one CPU gets to its
backlog late the flow arrives out of order. RoCE's go-back-N sees a gap, NAKs it and resends:
the emulator made a retransmission that no fabric with one path per flow would. Measured with
experiments/sendrecv.yaml under ECMP: 5 of 16 runs resent packets after out-of-sequence arrivals
without RPS, 0 of 12 with it. RPS picks the backlog by the flow's hash instead, one CPU per flow.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def cpu_mask(cpus: Iterable[int]) -> str:
    """The kernel's bitmap text for a set of CPUs: hex words of 32 bits, comma-separated."""
    bits = 0
    for c in cpus:
        bits |= 1 << c
    words = []
    while True:
        words.append(f"{bits & 0xFFFFFFFF:08x}")
        bits >>= 32
        if not bits:
            break
    return ",".join(reversed(words))


def all_cpus_mask() -> str:
    return cpu_mask(os.sched_getaffinity(0))


def steer(ifname: str, mask: str, sysfs: Path = Path("/sys/class/net")) -> None:
    """Set the RPS mask of every receive queue of a root-namespace interface."""
    for queue in (sysfs / ifname / "queues").glob("rx-*"):
        (queue / "rps_cpus").write_text(mask)


def host_shell_command(ifname: str, mask: str) -> str:
    """The same, for a host's interface, from a shell inside its network namespace: sysfs
    shows a namespace's interfaces only when mounted from it, so mount one in a throwaway
    mount namespace, over the machine's (unshare makes its mounts private: the unmount and the
    mount never reach the machine's /sys), as `ip netns exec` does."""
    return (f"unshare -m sh -c 'umount -l /sys && mount -t sysfs sysfs /sys && "
            f"for q in /sys/class/net/{ifname}/queues/rx-*; do echo {mask} > $q/rps_cpus; done'")
