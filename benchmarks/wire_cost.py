"""CPU cost per packet of the wire a cut link gets (fabric_emu/fabric/wires.py), as a ratio to a
plain veth pair, measured alternately in the same run. Needs root.

Two namespaces joined either by one veth pair (plain), or by the wired pair a link that a run's
events cut is built with: each end a veth of its own, the two middle ends redirected into each
other by tc (wired). A paced UDP sender sends 4 KB frames one way; CPU is read from /proc/stat
(the whole machine) over the same window, per packet received. The difference is what the wire
adds to each frame that crosses such a link; compare it with a switch hop's cost
(benchmarks/port_path.py, tens of microseconds on the userspace datapath).

  .venv/bin/python benchmarks/wire_cost.py [--rounds 3] [--seconds 3] [--pps 5000] [--smoke]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

from pyroute2 import netns

from fabric_emu.fabric import wires
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' namespace helpers
from tests.integration.netns_pair import bring_up  # noqa: E402

from port_path import paced_udp  # noqa: E402  (benchmarks are scripts, not a package)
from smoke import parse_args  # noqa: E402  (benchmarks/smoke.py: scripts, not a package)

TAG = f"fewc{os.getpid() % 10000}"
HOSTS = (f"{TAG}a", f"{TAG}b")
ENDS = (f"{TAG}e1", f"{TAG}e2")
IPS = ("10.96.0.1", "10.96.0.2")
MTU = 4200


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def build(mode: str) -> None:
    """The two ends, plain or wired, moved into their namespaces and addressed."""
    if mode == "plain":
        ip("link", "add", ENDS[0], "type", "veth", "peer", "name", ENDS[1])
    else:
        wires.make_wired_pair(*ENDS)
    for ns, end, addr in zip(HOSTS, ENDS, IPS):
        ip("link", "set", end, "netns", ns)
        ip("netns", "exec", ns, "ip", "link", "set", end, "mtu", str(MTU))
        bring_up(ns, end, addr)


def unbuild() -> None:
    for ns, end in zip(HOSTS, ENDS):
        subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "del", end], capture_output=True)


def measure(seconds: float, pps: int) -> dict:
    m = paced_udp(HOSTS[0], HOSTS[1], IPS[1], seconds, pps)
    tick_us = 1e6 / os.sysconf("SC_CLK_TCK")
    return {"sent": m["sent"], "received": m["received"], "us_per_pkt": m["busy_ticks"] * tick_us / max(1, m["received"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--pps", type=int, default=5000)
    args = parse_args(ap, rounds=1, seconds=0.5)
    results: dict[str, list[dict]] = {"plain": [], "wired": []}
    try:
        for ns in HOSTS:
            netns.create(ns)
        for r in range(args.rounds):
            for mode in ("plain", "wired"):
                build(mode)
                try:
                    m = measure(args.seconds, args.pps)
                finally:
                    unbuild()
                results[mode].append(m)
                print(f"round {r + 1} {mode}: {m['received']}/{m['sent']} packets, machine {m['us_per_pkt']:.2f} us/pkt")
    finally:
        unbuild()
        for ns in HOSTS:
            if ns in netns.listnetns():
                netns.remove(ns)
    plain = statistics.median(m["us_per_pkt"] for m in results["plain"])
    wired = statistics.median(m["us_per_pkt"] for m in results["wired"])
    print(f"machine us/pkt: plain {plain:.2f}, wired {wired:.2f}; the wire adds {wired - plain:.2f} us "
          f"per packet; ratio wired/plain = {wired / plain:.2f}")


if __name__ == "__main__":
    main()
