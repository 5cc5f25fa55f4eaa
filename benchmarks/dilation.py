"""Where does this machine stop keeping up? The quickstart at decreasing dilation.

Lower dilation = faster emulated links = more packets per second for OVS and the agents. The
baseline is the largest dilation, measured in the same run: a busbw fraction that falls below
it, rising CPU use or fidelity warnings mark where the machine, not the fabric, limits results.
  sudo .venv/bin/python benchmarks/dilation.py [--dilations 4000,2000,1000,500,250] [--size 16MB] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from smoke import parse_args  # benchmarks/smoke.py (benchmarks are scripts, not a package)

REPO = Path(__file__).resolve().parent.parent


def run(dilation: float, out: Path, size: str) -> dict:
    subprocess.run([sys.executable, "-m", "fabric_emu", "run", str(REPO / "experiments/quickstart.yaml"),
                    "--out", str(out / str(dilation)), "--set", f"topology.dilation={dilation}",
                    "--set", f"workload.size={size}"], cwd=REPO, capture_output=True, text=True)
    (run_dir,) = (out / str(dilation) / "quickstart").iterdir()
    return json.loads((run_dir / "summary.json").read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dilations", default="4000,2000,1000,500,250")
    ap.add_argument("--size", default="16MB")
    args = parse_args(ap, dilations="4000,2000", size="1MB")
    dilations = sorted((float(d) for d in args.dilations.split(",")), reverse=True)
    with tempfile.TemporaryDirectory(prefix="fabric-emu-bench-") as tmp:
        rows = [(d, run(d, Path(tmp), args.size)) for d in dilations]
    base = rows[0][1].get("busbw_fraction")
    print(f"quickstart (8 hosts, ring all-reduce of {args.size}) at decreasing dilation; "
          f"baseline = dilation {dilations[0]:g}")
    print(f"{'dilation':>9} {'link Mb/s':>10} {'status':>10} {'busbw/link':>11} {'vs base':>8} "
          f"{'CPU mean':>9} {'CPU max':>8} {'lost?':>6} {'trusted':>8}")
    for d, s in rows:
        f, fid = s.get("busbw_fraction"), s.get("fidelity", {})
        lost = s.get("transport", {}).get("unexplained_loss_packets", "-")
        ratio = f"{f / base:.3f}" if f and base else "-"
        print(f"{d:9g} {100e3 / d:10.1f} {s['status']:>10} {f if f is None else round(f, 3)!s:>11} {ratio:>8} "
              f"{fid.get('cpu_busy_mean')!s:>9} {fid.get('cpu_busy_max')!s:>8} {lost!s:>6} {fid.get('trusted')!s:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
