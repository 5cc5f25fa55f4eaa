"""ECMP against spraying and DLB where ECMP collides, over seeds: the collective's completion.

Runs `fabric-emu sweep experiments/ecmp-collision.yaml --over load_balancing=ecmp,spray,dlb
--seeds 1-N` (four 8 MB flows from leaf1 to leaf2 over four spines) and prints, per mode, the
mean completion time over the seeds, its cut against ECMP's, and its ratio to one flow alone on
an uplink (the collision-free time: the fastest flow of the ECMP runs). Ratios, measured in the
same sweep.

Run as root:  .venv/bin/python benchmarks/lb_modes.py [--seeds 5] [--smoke]
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
from pathlib import Path

from smoke import parse_args  # benchmarks/smoke.py (benchmarks are scripts, not a package)

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    args = parse_args(ap, seeds=1)
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, "-m", "fabric_emu", "sweep", "experiments/ecmp-collision.yaml",
                        "--over", "load_balancing=ecmp,spray,dlb", "--seeds", f"1-{args.seeds}",
                        "--out", out], cwd=REPO, check=True, stdout=subprocess.DEVNULL)
        (sweep,) = Path(out, "ecmp-collision").glob("sweep-*")
        rows = {r["load_balancing"]: r for r in csv.DictReader(open(sweep / "comparison.csv"))}
        alone = min(float(f["completion_fabric_us"])
                    for run in csv.DictReader(open(sweep / "runs.csv")) if run["load_balancing"] == "ecmp"
                    for f in csv.DictReader(open(Path(run["run_dir"]) / "flows.csv")))
    ecmp = float(rows["ecmp"]["jct_fabric_s_mean"]) * 1e6
    print(f"ECMP collision, 4 flows x 8 MB, seeds 1-{args.seeds}; one flow alone: {alone:.0f} us")
    for mode, r in rows.items():
        jct = float(r["jct_fabric_s_mean"]) * 1e6
        print(f"  {mode:6s} mean {jct:7.0f} us  cut vs ECMP {1 - jct / ecmp:5.0%}  "
              f"vs alone {jct / alone:.2f}x  ok {r['ok']}/{r['runs']}, trusted {r['trusted']}")


if __name__ == "__main__":
    main()
