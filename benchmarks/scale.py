"""Benchmark a large fabric end to end: `fabric-emu run` of a ring all-reduce over every host of
a generated leaf-spine, with `dilation: auto`.

Prints what a user of a big fabric cares about, from the run's own results folder: the
dilation auto chose, the fabric's bring-up time and, against it (measured in the same run),
how long the NICs of all hosts took to be ready and how much memory they use per host; the
bus bandwidth fraction; and whether the fidelity check trusts the run.

Run as root:  .venv/bin/python benchmarks/scale.py [--spines 4 --leaves 8 --hosts-per-leaf 4] [--smoke]
              .venv/bin/python benchmarks/scale.py --spines 4 --leaves 16 --hosts-per-leaf 8
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from smoke import parse_args  # benchmarks/smoke.py (benchmarks are scripts, not a package)

REPO = Path(__file__).resolve().parents[1]

SPEC = """\
name: scale
topology: {{name: ls-{s}x{l}x{h}, kind: leaf-spine, spines: {s}, leaves: {l}, hosts_per_leaf: {h},
           host_link: {{gbps: 100}}, fabric_link: {{gbps: 100}}, dilation: auto}}
workload: {{type: allreduce, algorithm: ring, size: {size}, iterations: 1, ranks: all, qps_per_peer: 1}}
seed: 1
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spines", type=int, default=4)
    ap.add_argument("--leaves", type=int, default=8)
    ap.add_argument("--hosts-per-leaf", type=int, default=4)
    ap.add_argument("--chunk-kb", type=int, default=256, help="ring chunk per step (size = hosts x chunk)")
    args = parse_args(ap, spines=2, leaves=2, hosts_per_leaf=2, chunk_kb=64)
    if os.geteuid() != 0:
        sys.exit("run as root: it builds a fabric")
    hosts = args.leaves * args.hosts_per_leaf
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "scale.yaml"
        spec.write_text(SPEC.format(s=args.spines, l=args.leaves, h=args.hosts_per_leaf,
                                    size=f"{hosts * args.chunk_kb}KB"))
        out = Path(tmp) / "results"
        r = subprocess.run([sys.executable, "-m", "fabric_emu", "run", str(spec), "--out", str(out)],
                           cwd=REPO, capture_output=True, text=True)
        runs = list((out / "scale").iterdir()) if (out / "scale").is_dir() else []
        if not runs:
            sys.exit(f"no results (exit {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        summary = json.loads((runs[0] / "summary.json").read_text())
        meta = json.loads((runs[0] / "metadata.json").read_text())
    nic = meta.get("nic_engines") or {}
    up = meta["phases_s"].get("bring_up")
    fid = summary.get("fidelity", {})
    print(f"{args.spines} spines x {args.leaves} leaves x {args.hosts_per_leaf} hosts = {hosts} hosts, "
          f"ring all-reduce of {hosts * args.chunk_kb} KB, status {summary['status']}")
    print(f"  dilation (auto):      {meta['dilation']}")
    print(f"  fabric up:            {up:.1f} s")
    if nic:
        print(f"  NICs ready:           {nic['ready_s']:.1f} s after the fabric was up "
              f"({nic['ready_s'] / up:.2f}x the bring-up), {nic['engines']} engine processes")
        print(f"  NIC memory per host:  {nic['rss_bytes_per_host'] / 1e6:.2f} MB "
              f"({nic['rss_bytes'] / 1e6:.0f} MB in all)")
    print(f"  busbw / host link:    {summary.get('busbw_fraction', float('nan')):.3f}")
    print(f"  trusted:              {fid.get('trusted')}")
    for w in fid.get("warnings", []):
        print(f"    warning: {w}")
    if r.returncode != 0:
        print(f"  exit {r.returncode}: {summary.get('error')}")


if __name__ == "__main__":
    main()
