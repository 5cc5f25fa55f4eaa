"""A fabric split over two machines against the same fabric on one (issue 19): start-up, CPU per
emulated packet and bus bandwidth of one ring all-reduce experiment, run as a user runs it
(`fabric-emu run`, with and without `machines:`).

The two machines are tests/integration/servers.py's namespace servers on this machine (their
own network, mount and PID namespaces, Open vSwitch and sshd, reached over real ssh), so both
sides share one kernel and its cores: the CPU ratio is the cost of the split itself (a second
Open vSwitch, the VXLAN stitch, ssh), not the gain of more machines. CPU per packet is the
whole machine's busy CPU over the traffic phase divided by the packets the switches sent.

Alternates the two (default 2 rounds), prints medians and ratios. Needs root.
  sudo .venv/bin/python benchmarks/machines.py [--rounds N] [--size 8MB] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from smoke import parse_args  # noqa: E402  benchmarks/smoke.py (benchmarks are scripts, not a package)
from tests.integration.servers import Server, two_servers  # noqa: E402

TOPOLOGY = "name: febm\nkind: leaf-spine\nspines: 2\nleaves: 2\nhosts_per_leaf: 2\n"


def run(folder: Path, name: str, size: str, servers: tuple[Server, ...] | None) -> dict:
    """One `fabric-emu run`; its figures."""
    (folder / "topo.yaml").write_text(TOPOLOGY)
    text = (f"name: {name}\ntopology: topo.yaml\nseed: 1\n"
            f"workload: {{type: allreduce, algorithm: ring, size: {size}, iterations: 2}}\n")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    if servers:
        text += "machines:\n" + "".join(
            f"  - {{name: {s.name}, address: {s.address}, ssh_address: {s.ssh_address}}}\n" for s in servers)
        env["FABRIC_EMU_SSH_CONFIG"] = str(servers[0].ssh_config)
    (folder / f"{name}.yaml").write_text(text)
    done = subprocess.run([sys.executable, "-m", "fabric_emu", "run", str(folder / f"{name}.yaml"), "--out",
                           str(folder / "results")], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    (run_dir,) = (folder / "results" / name).glob("*/")
    summary = json.loads((run_dir / "summary.json").read_text())
    meta = json.loads((run_dir / "metadata.json").read_text())
    busy_core_s = summary["fidelity"]["cpu_busy_mean"] * meta["machine"]["cpus"] * meta["phases_s"]["traffic"]
    return {"bring_up_s": meta["phases_s"]["bring_up"], "cpu_us_per_pkt": busy_core_s / summary["switch"]["tx_packets"] * 1e6,
            "busbw": summary["busbw_fraction"], "trusted": summary["fidelity"]["trusted"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--size", default="8MB")
    args = parse_args(ap, rounds=1, size="1MB")
    if os.geteuid() != 0:
        raise SystemExit("needs root")
    results: dict[str, list[dict]] = {"split": [], "whole": []}
    with tempfile.TemporaryDirectory(prefix="fabric-emu-bench-machines-") as tmp, \
            two_servers(f"febm{os.getpid() % 100000}") as servers:
        for r in range(args.rounds):
            for side in ("split", "whole"):
                folder = Path(tmp) / f"{side}{r}"
                folder.mkdir()
                results[side].append(run(folder, side, args.size, servers if side == "split" else None))
    med = {side: {k: statistics.median(x[k] for x in rows) for k in ("bring_up_s", "cpu_us_per_pkt", "busbw")}
           for side, rows in results.items()}
    for side, m in med.items():
        trusted = sum(x["trusted"] for x in results[side])
        print(f"  {side:5s}  bring-up {m['bring_up_s']:6.2f} s  CPU per switch packet {m['cpu_us_per_pkt']:7.1f} us"
              f"  busbw {m['busbw']:.3f}  trusted {trusted}/{len(results[side])}")
    s, w = med["split"], med["whole"]
    print(f"ratios split/whole: bring-up {s['bring_up_s'] / w['bring_up_s']:.2f}, CPU per packet "
          f"{s['cpu_us_per_pkt'] / w['cpu_us_per_pkt']:.2f}, busbw {s['busbw'] / w['busbw']:.3f}")


if __name__ == "__main__":
    main()
