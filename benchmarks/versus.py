"""A/B: the quickstart with an earlier revision of fabric-emu and with this tree, in one run.

Each side runs `fabric-emu run experiments/quickstart.yaml` from its own source tree (the
earlier one extracted with `git archive`, run from its own folder so `python -m` imports it),
on the same machine, Open vSwitch and Python environment, one after the other, `--rounds`
times. Per side it prints the bus bandwidth fraction and two costs per packet:

* Open vSwitch: CPU seconds of ovs-vswitchd over the run (its /proc stat, all threads) per
  packet the switches transmitted (summary.json switch.tx_packets);
* NICs: CPU seconds of the host agents (earlier revisions: each agent's cpu_s) or NIC engines
  (engine.cpu_s, once per engine) per data packet sent.

Run as root:  .venv/bin/python benchmarks/versus.py [--rev f6b04f0] [--rounds 2] [--size 8MB] [--smoke]
(--smoke: HEAD against HEAD, one small round.)

--scale-up: the quickstart fabric's all-reduce as a job, run by benchmarks/scale_up_run.py, three
ways per round: the earlier revision and this tree on the fabric alone, and this tree with four
2-GPU servers exchanging chains of scale-up messages (modelled by the NIC engines, no packets)
throughout: the NICs' CPU per fabric packet should not change (issue 22).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from smoke import parse_args  # benchmarks/smoke.py (benchmarks are scripts, not a package)

REPO = Path(__file__).resolve().parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")


def ovs_cpu_s() -> float:
    pid = int(Path("/var/run/openvswitch/ovs-vswitchd.pid").read_text())
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime, all threads


def nic_cpu_s(run_dir: Path) -> tuple[float, int]:
    """(CPU seconds of the NIC processes, data packets sent) from the agents' stats."""
    cpu, engines, packets = 0.0, {}, 0
    for f in (run_dir / "agents").glob("*.json"):
        a = json.loads(f.read_text())
        packets += sum(q["packets"] for q in a.get("send_qps", []))
        if "engine" in a:
            engines[a["engine"]["engine"]] = a["engine"]["cpu_s"] or 0.0
        else:
            cpu += a.get("cpu_s") or 0.0
    return cpu + sum(engines.values()), packets


def extract(rev: str, dest: Path) -> Path:
    """The source tree of revision rev (what a run needs) under dest."""
    dest.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "fabric_emu", "controller", "experiments",
                              "topologies"], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest)
    return dest


def run(src: Path, out: Path, size: str | None) -> dict:
    before = ovs_cpu_s()
    sets = ["--set", f"workload.size={size}"] if size else []
    subprocess.run([sys.executable, "-m", "fabric_emu", "run", str(src / "experiments/quickstart.yaml"),
                    "--out", str(out), *sets], cwd=src, capture_output=True, text=True)
    ovs = ovs_cpu_s() - before
    (run_dir,) = (out / "quickstart").iterdir()
    s = json.loads((run_dir / "summary.json").read_text())
    nic, packets = nic_cpu_s(run_dir)
    return {"busbw": s.get("busbw_fraction"), "ovs_us": ovs / s["switch"]["tx_packets"] * 1e6,
            "nic_us": nic / packets * 1e6, "trusted": s.get("fidelity", {}).get("trusted")}


def run_scale_up(src: Path, out: Path, size: str | None, fabric_only: bool) -> dict:
    """One run of benchmarks/scale_up_run.py from the source tree src (see --scale-up)."""
    before = ovs_cpu_s()
    cmd = [sys.executable, str(REPO / "benchmarks" / "scale_up_run.py"), str(out), "--size", size or "8MB",
           *(["--fabric-only"] if fabric_only else [])]
    r = subprocess.run(cmd, cwd=src, env={**os.environ, "PYTHONPATH": str(src)}, capture_output=True, text=True)
    ovs = ovs_cpu_s() - before
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} (in {src}) failed: {r.stderr[-2000:]}")
    (run_dir,) = (out / "scale-up-bench").iterdir()
    s = json.loads((run_dir / "summary.json").read_text())
    nic, packets = nic_cpu_s(run_dir)
    return {"busbw": s.get("busbw_fraction"), "ovs_us": ovs / s["switch"]["tx_packets"] * 1e6,
            "nic_us": nic / packets * 1e6, "trusted": s.get("fidelity", {}).get("trusted"),
            "scale_up_bytes": s.get("transport", {}).get("scale_up_bytes", 0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", default="f6b04f0", help="the earlier revision (git)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--size", help="all-reduce size (default: the quickstart's)")
    ap.add_argument("--scale-up", action="store_true",
                    help="an all-reduce job with and without scale-up transfers beside it (issue 22)")
    args = parse_args(ap, rev="HEAD", rounds=1, size="1MB")
    if os.geteuid() != 0:
        sys.exit("run as root: it builds fabrics")
    with tempfile.TemporaryDirectory() as tmp:
        old = extract(args.rev, Path(tmp) / "old")
        if args.scale_up:
            return scale_up_main(args, old, Path(tmp))
        results = {"earlier": [], "this tree": []}
        for i in range(args.rounds):
            results["earlier"].append(run(old, Path(tmp) / f"old-{i}", args.size))
            results["this tree"].append(run(REPO, Path(tmp) / f"new-{i}", args.size))
    print(f"quickstart, {args.rounds} round(s) each, earlier = {args.rev}")
    mean = means(results, lambda rows: "")
    e, t = mean["earlier"], mean["this tree"]
    print(f"  ratios this/earlier: OVS per packet {t['ovs_us'] / e['ovs_us']:.2f}, "
          f"NIC per packet {t['nic_us'] / e['nic_us']:.2f}")


def means(results: dict[str, list[dict]], extra: Callable[[list[dict]], str]) -> dict[str, dict[str, float]]:
    """Each side's mean busbw and CPU per packet over its rounds, printed a line a side (with
    extra(rows) before the rounds' trust)."""
    mean = {}
    for name, rows in results.items():
        m = mean[name] = {k: sum(r[k] for r in rows) / len(rows) for k in ("busbw", "ovs_us", "nic_us")}
        print(f"  {name:10s} busbw {m['busbw']:.3f}  OVS {m['ovs_us']:6.1f} us/switch packet  "
              f"NICs {m['nic_us']:6.1f} us/fabric packet  {extra(rows)}trusted {[r['trusted'] for r in rows]}")
    return mean


def scale_up_main(args: argparse.Namespace, old: Path, tmp: Path) -> None:
    """--scale-up: rounds of (earlier, this tree, this tree + scale-up), interleaved so the
    machine's drift falls on every side alike."""
    sides = {"earlier": (old, True), "this tree": (REPO, True), "+ scale-up": (REPO, False)}
    results: dict[str, list[dict]] = {name: [] for name in sides}
    for i in range(args.rounds):
        for k, (name, (src, fabric_only)) in enumerate(sides.items()):
            results[name].append(run_scale_up(src, tmp / f"{k}-{i}", args.size, fabric_only))
    print(f"all-reduce job on the quickstart fabric, {args.rounds} round(s) each, earlier = {args.rev}")
    mean = means(results, lambda rows: f"scale-up bytes {rows[0]['scale_up_bytes']:,}  ")
    e = mean["earlier"]["nic_us"]
    print(f"  NIC CPU per fabric packet / earlier: this tree {mean['this tree']['nic_us'] / e:.2f}, "
          f"this tree + scale-up {mean['+ scale-up']['nic_us'] / e:.2f}")


if __name__ == "__main__":
    main()
