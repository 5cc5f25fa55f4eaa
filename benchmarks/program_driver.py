"""A/B: the quickstart's ring all-reduce driven by the ring driver and by a per-rank program.

The same 8 MB x 2 ring over the same fabric, QPs and seed, run twice per round: once as the
experiment's `workload` (fabric_emu.nic.drivers.ring: progress read off per-QP counters, one step
posted at a time) and once as a one-job `workloads` list, which the NIC engines run as a
Program (fabric_emu.nic.drivers.program: every op with its dependencies). Prints busbw and the NIC
engines' CPU per data packet for both, and their ratio: what the general driver costs.

Run as root:  .venv/bin/python benchmarks/program_driver.py [--rounds 2] [--size 8MB] [--smoke]
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
sys.path.insert(0, str(REPO / "benchmarks"))
from versus import nic_cpu_s  # noqa: E402  (benchmarks are scripts, not a package)

from fabric_emu.spec.load import read_yaml  # noqa: E402


def quickstart(folder: Path, size: str | None, program: bool) -> Path:
    """experiments/quickstart.yaml with the all-reduce of `size` (None: its own), as its
    workload or (`program`) as the only job of a workloads list."""
    spec = read_yaml(REPO / "experiments/quickstart.yaml")
    spec["topology"] = str(REPO / "topologies" / Path(spec["topology"]).name)
    if size:
        spec["workload"]["size"] = size
    if program:
        spec["workloads"] = [{**spec.pop("workload"), "name": "ring"}]
    folder.mkdir()
    path = folder / "quickstart.yaml"
    path.write_text(json.dumps(spec))  # JSON is YAML
    return path


def run(experiment: Path, out: Path) -> dict:
    r = subprocess.run([sys.executable, "-m", "fabric_emu", "run", str(experiment), "--out", str(out)],
                       cwd=REPO, capture_output=True, text=True)
    (run_dir,) = (out / "quickstart").iterdir()
    s = json.loads((run_dir / "summary.json").read_text())
    if s.get("status") != "ok":
        sys.exit(f"run failed: {s.get('error')}\n{r.stderr[-2000:]}")
    nic, packets = nic_cpu_s(run_dir)
    return {"busbw": s["busbw_fraction"], "nic_us": nic / packets * 1e6,
            "trusted": s["fidelity"]["trusted"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--size", help="all-reduce size (default: the quickstart's)")
    args = parse_args(ap, rounds=1, size="1MB")
    if os.geteuid() != 0:
        sys.exit("run as root: it builds fabrics")
    results: dict[str, list[dict]] = {"ring driver": [], "program": []}
    with tempfile.TemporaryDirectory() as tmp:
        ring = quickstart(Path(tmp) / "ring", args.size, program=False)
        program = quickstart(Path(tmp) / "program", args.size, program=True)
        for i in range(args.rounds):
            results["ring driver"].append(run(ring, Path(tmp) / f"ring-{i}"))
            results["program"].append(run(program, Path(tmp) / f"program-{i}"))
    print(f"quickstart ring all-reduce, {args.rounds} round(s) each")
    mean = {}
    for name, rows in results.items():
        mean[name] = {k: sum(r[k] for r in rows) / len(rows) for k in ("busbw", "nic_us")}
        print(f"  {name:12s} busbw {mean[name]['busbw']:.3f}  NICs {mean[name]['nic_us']:5.1f} us/packet  "
              f"trusted {[r['trusted'] for r in rows]}")
    print(f"  ratio program/ring driver: NIC per packet {mean['program']['nic_us'] / mean['ring driver']['nic_us']:.2f}")


if __name__ == "__main__":
    main()
