"""Start-up and teardown of a 4-spine x 8-leaf x 4-host fabric, as a ratio against raw Mininet.

fabric-emu: controller process, Mininet + OVS (userspace datapath), egress queues on every link
end, routes installed and confirmed by barriers, every host pinging its ring neighbour.
Baseline, measured in the same process: raw Mininet building the same graph with plain OVS
bridges (userspace datapath, no controller, no queues). A leaf-spine graph has loops, so plain
L2 switches cannot make hosts reachable without a controller or STP: the baseline stops at
"bridges and links up", which flatters it.

Runs both alternately (default 3 rounds) and prints medians and ratios. Needs root.
  sudo .venv/bin/python benchmarks/startup.py [--rounds N] [--spines 4 --leaves 8 --hosts 4]
       [--datapath userspace|kernel] [--smoke]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from mininet.log import setLogLevel
from mininet.net import Mininet
from mininet.node import OVSSwitch

from fabric_emu.kernel import ovs_datapath
from fabric_emu.state.cleanup import clean_record
from fabric_emu.spec.topology import TopologySpec
from fabric_emu.fabric.build import PlanTopo
from fabric_emu.topo.plan import FabricPlan, build_plan
from fabric_emu.state.records import RunLock, RunRecord
from fabric_emu.fabric.routed import RoutedFabric

from smoke import parse_args  # benchmarks/smoke.py (benchmarks are scripts, not a package)


def fabric_emu_round(plan: FabricPlan) -> tuple[float, float]:
    """Bring-up and teardown exactly as `fabric-emu run` does them (RoutedFabric)."""
    record = RunRecord.new(f"bench-{os.getpid()}-{time.time_ns()}")
    workdir = record.new_workdir("fabric-emu-bench-")
    t0 = time.monotonic()
    routed = RoutedFabric(plan, record, workdir)
    try:
        routed.up(ready_timeout_s=60)
        routed.fabric.check_reachable([h.name for h in plan.hosts])
        up = time.monotonic() - t0
    finally:
        t1 = time.monotonic()
        routed.down()
        clean_record(record)
    return up, time.monotonic() - t1


def mininet_round(plan: FabricPlan) -> tuple[float, float]:
    datapath = ovs_datapath.datapath_of(plan.extra)

    def switch(name: str, **params) -> OVSSwitch:
        return OVSSwitch(name, datapath=ovs_datapath.MININET_DATAPATH[datapath], failMode="secure", **params)

    t0 = time.monotonic()
    net = Mininet(topo=PlanTopo(plan=plan), switch=switch, controller=None, autoSetMacs=False)
    net.start()
    up = time.monotonic() - t0
    t1 = time.monotonic()
    net.stop()
    return up, time.monotonic() - t1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--spines", type=int, default=4)
    ap.add_argument("--leaves", type=int, default=8)
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--datapath", choices=("userspace", "kernel"), default="userspace",
                    help="Open vSwitch datapath of both sides (kernel: needs the openvswitch module)")
    args = parse_args(ap, rounds=1, spines=2, leaves=2, hosts=1)
    if os.geteuid() != 0:
        print("needs root", file=sys.stderr)
        return 1
    setLogLevel("error")
    plan = build_plan(TopologySpec(name="bench", kind="leaf-spine", spines=args.spines,
                                   leaves=args.leaves, hosts_per_leaf=args.hosts))
    try:
        plan.extra["datapath"] = ovs_datapath.choose(args.datapath).to_dict()
    except ovs_datapath.DatapathUnavailable as e:
        print(f"error: --datapath kernel: {e}", file=sys.stderr)
        return 2
    if args.datapath == "kernel":
        ovs_datapath.prepare("kernel")  # the raw Mininet side runs first: the datapath before its bridges
    lock = RunLock()
    if not lock.acquire():
        print("another fabric-emu run is in progress", file=sys.stderr)
        return 1
    ours: list[tuple[float, float]] = []
    raw: list[tuple[float, float]] = []
    try:
        for _ in range(args.rounds):
            raw.append(mininet_round(plan))
            ours.append(fabric_emu_round(plan))
    finally:
        lock.release()
    med = lambda xs, i: statistics.median(x[i] for x in xs)  # noqa: E731
    print(f"fabric {args.spines}x{args.leaves}x{args.hosts} on the {args.datapath} datapath: {len(plan.switches)} switches, "
          f"{len(plan.hosts)} hosts, {len(plan.links)} links; median of {args.rounds} rounds")
    print(f"{'':28}{'start (s)':>10}{'stop (s)':>10}")
    print(f"{'raw Mininet + plain OVS':28}{med(raw, 0):10.2f}{med(raw, 1):10.2f}")
    print(f"{'fabric-emu (routed, pinged)':28}{med(ours, 0):10.2f}{med(ours, 1):10.2f}")
    print(f"{'ratio':28}{med(ours, 0) / med(raw, 0):10.2f}{med(ours, 1) / med(raw, 1):10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
