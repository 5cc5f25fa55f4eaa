"""Benchmark the NIC's CPU cost per packet: the foundation's host agent against today's engine.

    fenc<pid>tx [a] ---- veth ---- [b] fenc<pid>rx      both ends shaped as host NICs

Two hosts run a 2-rank ring all-reduce over one veth pair whose ends are shaped and programmed
as a fabric does a host NIC (class tree, PFC gate, per-QP HTB, host_egress, qp_classify), at
the same line rate, the same message sizes, in the same run:

* baseline: the foundation's agent (commit FOUNDATION, extracted with `git archive` into a
  temporary folder): one Python process per host that paced every packet itself;
* today: one NIC engine process (fabric_emu.nic) serving both hosts, the kernel pacing.

Both move the same packets (each host sends and receives S bytes); the figure is CPU seconds
(user + system of the processes, from their own accounting) per data packet sent, each of which
is also received. Ratios, not absolutes: this machine is shared and noisy.

Run as root:  .venv/bin/python benchmarks/nic_cpu.py [--rate-mbps 40] [--size 24MB] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from smoke import parse_args  # benchmarks/smoke.py (benchmarks are scripts, not a package)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the tests' namespace helpers
from fabric_emu.kernel import shaping  # noqa: E402
from fabric_emu.ports import datapath, queues  # noqa: E402
from fabric_emu.ports.model import NIC_QUEUE_FRAMES, PortEnd  # noqa: E402
from fabric_emu.spec.units import parse_size  # noqa: E402
from tests.integration.netns_pair import recorded_pins, veth_pair  # noqa: E402

FOUNDATION = "c5bdb97"  # the last commit before the NIC model was rebuilt (issue 6)
TAG = f"fenc{os.getpid() % 10000}"
IPS = ("10.94.0.1", "10.94.0.2")
MTU, ROCE_MTU = 4200, 4096
TIMEOUT_S = 300.0


def shape_hosts(pair, rate_bps: float, pins: Path) -> datapath.PortMaps:
    """Both veth ends as host NICs, as fabric.py and ports/runtime.py set them up."""
    for ns, ifname in ((pair.tx_ns, pair.tx_if), (pair.rx_ns, pair.rx_if)):
        with shaping.open_iproute(ns) as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname=ifname)[0], mtu=MTU)
    limits = {0: 2_000_000, 3: 2_000_000, 6: NIC_QUEUE_FRAMES * (MTU + 14)}
    for ns, ifname in ((pair.tx_ns, pair.tx_if), (pair.rx_ns, pair.rx_if)):
        queues.shape_classes(queues.PortQueues(ifname, rate_bps, MTU, limits, f"/var/run/netns/{ns}",
                                               qp_classes=True))
    maps = datapath.PortMaps(pins)
    ends = [PortEnd(1, "a", 0, pair.tx_if, 0, "host", 100, rate_bps),
            PortEnd(2, "b", 0, pair.rx_if, 0, "host", 100, rate_bps)]
    datapath.attach(pins, ends, {"a": f"/var/run/netns/{pair.tx_ns}", "b": f"/var/run/netns/{pair.rx_ns}"}, maps)
    return maps


def _ranks() -> list[dict]:
    return [{"name": "h1", "ip": IPS[0], "index": 0}, {"name": "h2", "ip": IPS[1], "index": 1}]


def _base_config(host: int, rate_bps: float, size: int, stats: Path) -> dict:
    return {"host": f"h{host + 1}", "ip": IPS[host], "rate_bps": rate_bps, "roce_mtu": ROCE_MTU,
            "ranks": _ranks(), "rank": host,
            "workload": {"size": size, "iterations": 1, "qps_per_peer": 1},
            "seed": 1, "stats_path": str(stats), "timeout_s": TIMEOUT_S}


def _go(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        line = p.stdout.readline().strip()
        if line != "READY":
            raise RuntimeError(f"process {p.args} said {line!r}, not READY")
    go = time.time() + 0.5
    for p in procs:
        p.stdin.write(f"GO {go:.6f}\n")
        p.stdin.flush()
    for p in procs:
        p.stdout.readline()  # DONE (or EOF when it gave up)
    for p in procs:
        p.stdin.close()  # an engine drains until STOP or end of input
        p.wait(timeout=TIMEOUT_S + 10)


def _popen(cmd: list[str], cwd: Path, env: dict | None = None) -> subprocess.Popen:
    """cwd matters: `python -m` imports from it before PYTHONPATH."""
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
                            env=env, cwd=cwd)


def foundation(pair, rate_bps: float, size: int, work: Path) -> dict:
    src = work / "foundation"
    src.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", FOUNDATION, "fabric_emu"],
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=__import__("io").BytesIO(archive)) as tar:
        tar.extractall(src)
    env = {**os.environ, "PYTHONPATH": str(src)}
    procs = []
    for i, ns in enumerate((pair.tx_ns, pair.rx_ns)):
        cfg = work / f"base-{i}.json"
        cfg.write_text(json.dumps(_base_config(i, rate_bps, size, work / f"base-stats-{i}.json")))
        # fabric_emu.agent: the foundation's name for its NIC agent (today's fabric_emu.nic)
        procs.append(_popen(["ip", "netns", "exec", ns, sys.executable, "-m", "fabric_emu.agent", str(cfg)], src, env))
    _go(procs)
    stats = [json.loads((work / f"base-stats-{i}.json").read_text()) for i in range(2)]
    return {"cpu_s": sum(s["cpu_s"] for s in stats),
            "packets": sum(q["packets"] for s in stats for q in s["send_qps"]),
            "status": [s["status"] for s in stats]}


def engine(pair, rate_bps: float, size: int, work: Path) -> dict:
    from fabric_emu.nic.launch import tick_for

    hosts = []
    for i, (ns, ifname) in enumerate(((pair.tx_ns, pair.tx_if), (pair.rx_ns, pair.rx_if))):
        hosts.append({**_base_config(i, rate_bps, size, work / f"engine-stats-{i}.json"),
                      "netns": f"/var/run/netns/{ns}", "ifname": ifname, "link_mtu": MTU})
    tick = tick_for(rate_bps, MTU)
    cfg = work / "engine.json"
    cfg.write_text(json.dumps({"engine": 0, "tick_s": tick, "hosts": hosts}))
    _go([_popen([sys.executable, "-m", "fabric_emu.nic", str(cfg)], REPO)])
    stats = [json.loads((work / f"engine-stats-{i}.json").read_text()) for i in range(2)]
    e = stats[0]["engine"]
    print(f"  (engine: user {e['user_s']:.2f} s, system {e['system_s']:.2f} s)")
    return {"cpu_s": e["cpu_s"],
            "packets": sum(q["packets"] for s in stats for q in s["send_qps"]),
            "status": [s["status"] for s in stats]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate-mbps", type=float, default=40.0, help="emulated line rate of both hosts")
    ap.add_argument("--size", default="24MB", help="all-reduce size: each host sends this much")
    args = parse_args(ap, size="4MB")  # fewer and the engine's CPU time can read 0
    if os.geteuid() != 0:
        sys.exit("run as root: it creates network namespaces")
    rate, size = args.rate_mbps * 1e6, parse_size(args.size)
    with (veth_pair(TAG, IPS[0], IPS[1]) as pair, recorded_pins("bench-nic") as pins,
          tempfile.TemporaryDirectory() as tmp):
        maps = shape_hosts(pair, rate, pins)
        try:
            results = {"foundation agent": foundation(pair, rate, size, Path(tmp)),
                       "engine": engine(pair, rate, size, Path(tmp))}
        finally:
            maps.close()
    print(f"2 hosts, ring all-reduce of {args.size} each way at {args.rate_mbps:g} Mb/s emulated")
    per = {}
    for name, r in results.items():
        per[name] = r["cpu_s"] / r["packets"] * 1e6
        print(f"  {name:17s} {r['packets']:6d} packets  {r['cpu_s']:6.2f} CPU s  "
              f"{per[name]:6.1f} us/packet  status {r['status']}")
    print(f"  foundation / engine CPU per packet: {per['foundation agent'] / per['engine']:.1f}x")


if __name__ == "__main__":
    main()
